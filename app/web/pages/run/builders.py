"""What each view of the Run page shows, computed once per version for every session (`live.SHARED`): the
builders that `views.VIEWS` names."""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.components.plot import PlotData

from app.access.gate import Services
from app.web import charts, live
from app.web.common import format_time, run_choices
from app.web.pages import completions, training, values
from app.web.pages.run.frame import ChartOptions, Frame, expected_prompts, value_count, value_splits
from app.web.pages.run.header import header, stage_progress
from app.web.remaining import clock_from_metrics
from storage import Store
from storage.lifecycle import LIVE

MAX_LOG_LINES = 300
MAX_POINTS = charts.MAX_POINTS


def button_updates(run: dict[str, Any] | None) -> list[Any]:
    status = run["status"] if run else None
    return [gr.Button(interactive=status in ("queued", "running")),
            gr.Button(interactive=status in ("stopped", "interrupted", "failed")),
            gr.Button(interactive=run is not None and status not in LIVE)]


def plot_data(spec: dict[str, Any]) -> PlotData:
    """A figure spec serialised once: shared by every session, it is not turned into JSON again for each."""
    return PlotData(type="plotly", plot=charts.to_json(spec))


def header_view(store: Store, run: dict[str, Any], value_set: dict[str, Any] | None, split: str) -> dict[str, Any]:
    marker = f'<div id="run-live" data-run="{int(run["id"])}" hidden></div>'  # the run the poller asks about
    evaluations = store.get_evaluations(run["id"]) if run.get("best_eval_accuracy") is not None else []
    return {"header": header(run, evaluations, clock_from_metrics(store.latest_metrics(run["id"]))),
            "progress": marker + stage_progress(run, split, value_set)}


def controls_view(services: Services, run: dict[str, Any], split: str = "train") -> dict[str, Any]:
    """The error box (as a visitor may read it: `Services.public_text`), the buttons, the picker's labels and the
    split picker's choices: component updates (each costs the server a component built and the session's config
    updated), so sent only when the status, the error or the splits changed."""
    error = services.public_text(run.get("error"))
    return {"error": gr.Textbox(value=error, visible=bool(error)),
            "picker": gr.Dropdown(choices=run_choices(services.store)),
            "split": gr.Dropdown(choices=value_splits(run) or [split], value=split),
            **dict(zip(("stop", "resume", "delete"), button_updates(run), strict=True))}


def _stats(store: Store, run: dict[str, Any], split: str) -> dict[str, Any]:
    """The split's aggregates of the run's own rows (`Store.value_stats`), once per change of them for every
    session."""
    version = (value_count(run, split), run.get("values_revision"))
    return live.SHARED.get(("stats", run["id"], split), version, lambda _prev: store.value_stats(run["id"], split))


def values_view(store: Store, run: dict[str, Any], value_set: dict[str, Any] | None, split: str) -> dict[str, Any]:
    if value_set is None or not value_splits(run):
        stats = {"count": 0, "filtered": 0, "num_samples": 0, "mean_v_star": None, "correct": [],
                 "histogram": {"start": 0.0, "width": 1.0, "kept": [], "filtered": []}}
        view = values.render(stats, [], split, None, None)
    else:
        summary = (value_set.get("summary") or {}).get(split) or value_set.get("summary")
        expected = expected_prompts(run)
        note = f" (of {expected}, still estimating)" if expected and run.get("stage") == "values" else ""
        view = values.render(_stats(store, run, split), value_splits(run), split,
                             summary if isinstance(summary, dict) else None, run.get("best_eval_accuracy"), note,
                             values.band_of(run))
    return {k: plot_data(v) if k in ("histogram", "correct_bar", "pass_rates") else v for k, v in view.items()}


def _page(store: Store, run: dict[str, Any], split: str, order: str, search: str | None,
          filtered: bool | None = None) -> list[dict[str, Any]]:
    """One page of the run's table, shared per (split, order, search). In stage-1 order without a search, while
    the run's rows are only added after the last one (its revision unchanged), a page that is full never changes
    and one that is not only needs the rows added since; anything else reads the page again."""
    sort, descending = values.ORDERS.get(order, ("id", False))
    version = (value_count(run, split), run.get("values_revision"))
    incremental = sort == "id" and not descending and not search

    def compute(previous: tuple[tuple[int, Any], list[dict[str, Any]]] | None
                ) -> tuple[tuple[int, Any], list[dict[str, Any]]]:
        if incremental and previous is not None and previous[0][1] == version[1] and previous[0][0] <= version[0]:
            rows = previous[1]
            if len(rows) >= values.PAGE_ROWS:
                return version, rows
            if filtered is None:
                new = store.values_after(run["id"], split, rows[-1]["id"] if rows else 0,
                                         limit=values.PAGE_ROWS - len(rows))
                return version, rows + new
        return version, store.values_page(run["id"], split, text=search or None, filtered=filtered,
                                          sort=sort, descending=descending, limit=values.PAGE_ROWS)

    key = ("page", run["id"], split, sort, descending, search or "", filtered)
    return live.SHARED.get(key, version, compute)[1]


def table_view(store: Store, run: dict[str, Any] | None, split: str, order: str,
               search: str | None) -> dict[str, Any]:
    if not value_splits(run):
        return {"table_info": "", "table": values.values_frame([], 0)}
    return values.render_table(_page(store, run, split, order, search), _stats(store, run, split), order, search)


def filtered_view(store: Store, run: dict[str, Any] | None, split: str) -> dict[str, Any]:
    if not value_splits(run):
        return values.render_filtered([], {"count": 0, "filtered": 0, "num_samples": 0})
    rows = _page(store, run, split, "stage-1 order", None, filtered=True)
    return values.render_filtered(rows, _stats(store, run, split))


def _series(store: Store, run_id: int, metric_id: int) -> dict[str, Any]:
    """The run's training curves, downsampled in SQL once (`Store.metric_series`), then extended with only the
    metric rows newer than the last one seen; downsampled again once they grow past twice `MAX_POINTS`."""
    def compute(previous: dict[str, Any] | None) -> dict[str, Any]:
        # The built-in panels' metrics, and those the run's reward functions logged (`log_metric`).
        panels = [*charts.TRAINING_METRICS, *charts.reward_metric_panels(store.metric_names(run_id))]
        names = [name for name, _ in panels]
        if previous is not None and previous["metric_id"] < metric_id:
            data = {k: {f: list(v) for f, v in d.items()} for k, d in previous["data"].items()}
            for row in store.get_metrics(run_id, after_id=previous["metric_id"], names=names):
                d = data.setdefault(row["name"], {"step": [], "value": [], "count": [], "min": [], "max": []})
                for field, item in (("step", row["step"]), ("value", row["value"]), ("count", 1),
                                    ("min", row["value"]), ("max", row["value"])):
                    d[field].append(item)
            if all(len(d["step"]) <= 2 * MAX_POINTS for d in data.values()):
                return {"metric_id": metric_id, "data": data}
        return {"metric_id": metric_id, "data": store.metric_series(run_id, names, max_points=MAX_POINTS)}

    return live.SHARED.get(("series", run_id), metric_id, compute)


def eval_pass_rates(store: Store, run: dict[str, Any], ids: dict[str, int],
                    value_set: dict[str, Any] | None) -> dict[str, float]:
    """The reference pass@1 and pass@N drawn beside the eval accuracy: on the held-out prompts it is measured on
    (their stage-1 split, "eval"), else none (the training prompts' rates would compare different prompts)."""
    def compute(_previous: Any) -> dict[str, float]:
        if value_set is None or not value_count(run, "eval"):
            return {}
        summary = ((value_set.get("summary") or {}).get("eval")) if isinstance(value_set.get("summary"), dict) else None
        return values.ceilings(_stats(store, run, "eval"), summary if isinstance(summary, dict) else None)

    version = (ids["evaluations"], value_count(run, "eval"), run.get("values_revision"))
    return live.SHARED.get(("eval-rates", run["id"]), version, compute)


def training_view(store: Store, run_id: int, ids: dict[str, int], chart: ChartOptions,
                  ceilings: dict[str, float]) -> dict[str, Any]:
    def figure(_previous: Any) -> Any:
        series, buckets = charts.bucketed_series(_series(store, run_id, ids["metrics"])["data"])
        x_title = "step"
        if chart.x_axis == "time":
            series, x_title = charts.time_axis(series, store.step_times(run_id)), "minutes since the first step"
        elif chart.x_axis == "compute":
            logged = store.metric_series(run_id, ["compute_flops"], max_points=MAX_POINTS).get("compute_flops")
            pairs = list(zip(logged["step"], logged["value"])) if logged else []
            series = charts.compute_axis(series, [(s, v) for s, v in pairs if v is not None])
            x_title = "compute (TFLOP, stage 1 included)" if pairs else "step (this run logged no compute)"
        panels = [*charts.TRAINING_METRICS, *charts.reward_metric_panels(series)]
        return plot_data(charts.training_figure_spec(series, smoothing=chart.smoothing, ceilings=ceilings,
                                                     metrics=panels, buckets=buckets, x_title=x_title,
                                                     log_y=chart.log_y))

    version = (ids["metrics"], tuple(sorted(ceilings.items())))
    plot = live.SHARED.get(("training", run_id, chart), version, figure)
    evaluations = live.SHARED.get(("evaluations", run_id), ids["evaluations"],
                                  lambda _prev: training.evaluations_frame(store.get_evaluations(run_id)))
    return {"plot": plot, "evaluations": evaluations}


def samples_view(store: Store, run_id: int, sample_id: int, frame: Frame) -> dict[str, Any]:
    """The completions of one logged step (the latest, or the nearest at or below the slider's), filtered and
    sorted: the steps and the step's rows are read once per new sample for every session."""
    splits = live.SHARED.get(("sample-splits", run_id), sample_id, lambda _prev: store.sample_splits(run_id))
    split = frame.sample_split if frame.sample_split in splits or not splits else splits[0]
    steps = live.SHARED.get(("sample-steps", run_id, split), sample_id,
                            lambda _prev: store.sample_steps(run_id, split))
    step = completions.shown_step(steps, frame.step, frame.latest)
    query = completions.sample_query(frame.correct, frame.text, frame.sort)
    rows = [] if step is None else live.SHARED.get(
        ("samples", run_id, split, step, tuple(sorted(query.items()))), sample_id,
        lambda _prev: store.step_samples(run_id, step, split, limit=completions.MAX_ROWS, **query))
    if step is None:
        info = "No completions logged yet: a training run logs its sampled completions at each logging step."
    else:
        info = (f"Step **{step}** ({'the latest; ' if step == steps[-1] else ''}{len(steps)} logged steps, "
                f"{steps[0]} to {steps[-1]}): {len(rows)} completions"
                + (f" (the first {completions.MAX_ROWS})" if len(rows) >= completions.MAX_ROWS else "") + ".")
    return {"samples": completions.samples_frame(rows), "samples_info": info,
            "samples_step": completions.step_slider(steps, step), "samples_latest": frame.latest,
            "samples_split": gr.Radio(choices=splits or [split], value=split)}


def logs_view(services: Services, run_id: int, log_id: int) -> dict[str, Any]:
    store, jobs, public = services.store, services.scheduler, services.public_text

    def compute(previous: tuple[int, list[str]] | None) -> tuple[int, list[str]]:
        after, lines = (previous[0], previous[1]) if previous is not None and previous[0] <= log_id else (0, [])
        if not after:
            after = max(0, log_id - MAX_LOG_LINES)  # ids of one run grow by one per line: the last page at most
        new = [f"{format_time(x['created_at'])} {x['level']:7} {public(x['message'])}"
               for x in store.get_logs(run_id, after_id=after, limit=None)]
        return log_id, (lines + new)[-MAX_LOG_LINES:]

    text = "\n".join(live.SHARED.get(("logs", run_id), log_id, compute)[1])
    run = store.get_run(run_id)
    if getattr(getattr(jobs, "backend", None), "name", None) == "ray" and run and run.get("ray_job_id"):
        # A Ray run's worker output is the job's log, on the cluster (a local worker's is a file of the data folder).
        output = live.SHARED.get(("ray-logs", run_id), log_id,
                                 lambda _prev: public(jobs.worker_output(run_id, run, 40)))
        text += f"\n\n--- output of Ray job {run['ray_job_id']} (last lines) ---\n{output}"
    return {"logs": text}
