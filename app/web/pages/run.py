"""Run page: one run, live while it works.

What the page shows is a list of views (`VIEWS`): each declares its tab, the poller's group that redraws it, the
components it fills, what moves it and how it is built; the page's outputs, its tabs and the poller's groups are
derived from that list, so a new view is one declaration there (and its component in the layout).

A `gr.Timer` ticks every `POLL_SECONDS` while the run is active (queued, running, stopping) and is switched off
(`gr.Timer(active=False)`) once it is not: a finished, failed, stopped or interrupted run costs nothing while its
page stays open. Picking an active run, or resuming this one, switches it on again.

A tick is cheap, on both sides. Its event runs in the browser only (the poller, `app/web/static/run_poller.js`,
given `POLLER_CONFIG`): a Gradio event, even one that changes nothing, makes the page walk every component of the
app twice (their loading status), which is costly on this page; so the tick only asks `run_version` for a short
string per group saying what the run could show, read from a snapshot shared by every session (`live.snapshot`,
read at most once a second). When one moved, the poller clicks that group's hidden Redraw button (at most every
`LIVE_REDRAW_SECONDS`, at once when the status changed), and that Gradio event (`draw_group`) sends only that
group's outputs. A session's own events (`refresh`: a tab opened, a filter changed, a run picked) send only the
views on screen whose version moved. Each session keeps in a `gr.State` only the run id, the selected tab and one
version per view. What a view shows is computed once per version for all sessions (`live.SHARED`).
"""

from __future__ import annotations

import html
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import gradio as gr
from gradio.components.plot import PlotData

from a2po.batches import spec_batch_figures
from a2po.settings import uses_vllm
from app.access.gate import Services
from app.web import charts, live
from app.web.common import elapsed_seconds, format_duration, format_time, progress_bar, run_choices, status_badge
from app.web.pages import completions, training, values
from app.web.remaining import Remaining, clock_from_metrics, estimate_remaining, training_seconds
from storage import Store
from storage.lifecycle import LIVE, UNFINISHED

POLL_SECONDS = 2.5
# How often a page on a live run redraws at most (a run writes every second or two); a change of status at once.
LIVE_REDRAW_SECONDS = 5.0
# Opens the Run page's tab (its button's id comes from the tab's elem_id "page-run" in app.web): run in the browser,
# since a Gradio event with the main tabs as an output would make every later event walk the whole app.
SHOW_RUN_TAB = "() => { document.getElementById('page-run-button')?.click(); return []; }"
MAX_LOG_LINES = 300
MAX_POINTS = charts.MAX_POINTS
X_AXES = ("step", "time", "compute")  # the Training tab's x axes



@dataclass
class RunPage:
    picker: gr.Dropdown
    state: gr.State
    timer: gr.Timer
    clone: gr.Button


@dataclass(frozen=True)
class ChartOptions:
    """How the Training tab draws its curves: EMA smoothing, x by "step", "time" or "compute", log-scale y."""

    smoothing: float = 0.6
    x_axis: str = "step"
    log_y: bool = False

    @classmethod
    def of(cls, smoothing: float | None, x_axis: str | None, log_y: bool | None) -> ChartOptions:
        return cls(float(smoothing if smoothing is not None else 0.6), x_axis if x_axis in X_AXES else "step",
                   bool(log_y))


def new_state(run_id: int | None, tab: str = "values") -> dict[str, Any]:
    """What a session shows for `run_id`: nothing yet (one version per view, set once drawn; `polling`: whether
    the page's timer is on, None while unknown, so the first refresh sets it either way)."""
    return {"run_id": run_id, "tab": tab, "polling": None, "shown": {}}


def stage_progress(run: dict[str, Any], split: str, value_set: dict[str, Any] | None) -> str:
    """Two progress bars: stage 1 (V* estimation) and stage 2 (training, or evaluation for evaluate runs). Stage 1
    samples the training prompts, then the held-out ones; its bar says which it is at, with that split's count."""
    action, stage, status = run["action"], run.get("stage"), run["status"]
    progress = run.get("progress") or 0.0
    done = status == "finished"
    num_values = _count(run, split)
    expected = _expected_prompts(run)
    if value_set is not None and value_set.get("complete"):
        s1, d1 = 1.0, f"{num_values} prompts"
    elif stage == "values":
        train = _count(run, "train")
        held_out = (run.get("config") or {}).get("dataset", {}).get("eval_size")
        s1 = progress
        if expected is not None and train >= expected and held_out:  # the training prompts are done
            d1 = f"held-out prompts {_count(run, 'eval')} / {held_out} (the {train} training prompts done)"
        else:
            d1 = f"training prompts {train} / {expected}" if expected else f"{train} training prompts"
    elif action == "evaluate" and not run.get("value_set_id"):
        s1, d1 = None, "not needed"
    else:
        s1 = 1.0 if (done or stage in ("train", "eval")) and num_values else (0.0 if status in UNFINISHED else None)
        d1 = f"{num_values} prompts" if num_values else "waiting"
    bars = [progress_bar("Stage 1 · V* estimation", s1, d1, elem="progress-stage1")]
    if action != "values":
        label = "Evaluation" if action == "evaluate" else "Stage 2 · A*-PO training"
        if done:
            s2, d2 = 1.0, "done"
        elif stage in ("train", "eval"):
            s2, d2 = progress, f"stage {stage}"
        else:
            s2, d2 = (0.0, "waiting for stage 1") if status in UNFINISHED else (None, "not reached")
        bars.append(progress_bar(label, s2, d2, elem="progress-stage2"))
    return "".join(bars)


def _expected_prompts(run: dict[str, Any]) -> int | None:
    dataset = (run.get("config") or {}).get("dataset") or {}
    if dataset.get("source") == "arithmetic" and dataset.get("num_prompts"):
        return int(dataset["num_prompts"])  # train prompts; the eval prompts come on top
    return None


def accuracy_change(evaluations: list[dict[str, Any]]) -> str:
    """"accuracy 6% -> 55%": held-out greedy accuracy at the first evaluation (step 0: before training) and at the
    latest one, from `Store.get_evaluations` rows; "" before any evaluation."""
    points = sorted((e["step"], e["metrics"]["eval_accuracy"]) for e in evaluations
                    if isinstance((e.get("metrics") or {}).get("eval_accuracy"), (int, float)))
    if not points:
        return ""
    (first_step, first), (last_step, last) = points[0], points[-1]
    if len(points) == 1:
        when = "before training" if first_step == 0 else f"at step {first_step}"
        return f'<span id="run-accuracy">held-out accuracy <b>{first:.0%}</b> {when}</span>'
    return (f'<span id="run-accuracy">held-out accuracy <b>{first:.0%} → {last:.0%}</b> '
            f"(step {first_step} → step {last_step}, greedy, same prompts)</span>")


def remaining_text(estimate: Remaining) -> str:
    """"remaining ≈ 2m 03s" (the whole run), "remaining ≥ 30s (training not measured yet)" or "remaining ≈ –"."""
    if estimate.text().startswith("≥"):
        shown = f"remaining {estimate.text()} ({' and '.join(estimate.unknown)} not measured yet)"
    else:
        shown = f"remaining ≈ {estimate.text()}"
    return f'<span id="run-remaining">{html.escape(shown)}</span>'


def sampler(spec: dict[str, Any] | None) -> str:
    """The engine that samples a run (stage 1, rollouts, evaluation), from its spec: vLLM in the training process
    where it says so (`a2po.settings.uses_vllm`: the worker follows the spec), else the library's own decoder."""
    config = (spec or {}).get("config") or {}
    if not uses_vllm(config):
        return "the native decoder"
    mode = config.get("vllm_mode") or "colocate"
    return "vLLM (colocated)" if mode == "colocate" else f"vLLM ({mode})"


def header(run: dict[str, Any], evaluations: list[dict[str, Any]] | None = None,
           clock: dict[str, float] | None = None) -> str:
    """The run's title line and facts: the engine that samples it (`sampler`), its times (wall time since it
    started; training time and the remaining estimate from its clock, `clock_from_metrics`) and its accuracy before
    and after training."""
    done = len({e["step"] for e in evaluations or []})
    estimate = estimate_remaining(run, clock, done or None)
    parts = [f"### #{run['id']} {html.escape(run['name'])} {status_badge(run['status'])}",
             f"**{run['action']}** · model `{run['model']}` · dataset `{run['dataset']}` · sampled by "
             f'<span id="run-sampler">{html.escape(sampler(run.get("config")))}</span> · stage '
             f"`{run.get('stage') or '–'}` · created {format_time(run['created_at'])} · wall time "
             f"{format_duration(elapsed_seconds(run))} · training time {format_duration(training_seconds(clock))} · "
             + remaining_text(estimate)]
    figures = spec_batch_figures(run.get("config"))
    if figures is not None and run.get("action") == "train":
        parts.append(f'<span id="run-batch">per optimizer step: {html.escape(figures.text())}</span>')
    change = accuracy_change(evaluations or [])
    if change:
        parts.append(change)
    elif run.get("best_eval_accuracy") is not None:
        parts.append(f"best eval accuracy **{run['best_eval_accuracy']:.1%}**")
    return "\n\n".join(parts)


def _button_updates(run: dict[str, Any] | None) -> list[Any]:
    status = run["status"] if run else None
    return [gr.Button(interactive=status in ("queued", "running")),
            gr.Button(interactive=status in ("stopped", "interrupted", "failed")),
            gr.Button(interactive=run is not None and status not in LIVE)]


def _plot(spec: dict[str, Any]) -> PlotData:
    """A figure spec serialised once: shared by every session, it is not turned into JSON again for each."""
    return PlotData(type="plotly", plot=charts.to_json(spec))


def _count(run: dict[str, Any] | None, split: str) -> int:
    """The run's own V* rows of one split (`Store.set_run_values` keeps the count on the run's row)."""
    return int(((run or {}).get("value_counts") or {}).get(split, 0))


def _splits(run: dict[str, Any] | None) -> list[str]:
    return sorted(s for s, n in ((run or {}).get("value_counts") or {}).items() if n)




# ------------------------------------------------------------------ what the views show, computed once per version


def _header_view(store: Store, run: dict[str, Any], value_set: dict[str, Any] | None,
                 split: str) -> dict[str, Any]:
    marker = f'<div id="run-live" data-run="{int(run["id"])}" hidden></div>'  # the run the poller asks about
    evaluations = store.get_evaluations(run["id"]) if run.get("best_eval_accuracy") is not None else []
    return {"header": header(run, evaluations, clock_from_metrics(store.latest_metrics(run["id"]))),
            "progress": marker + stage_progress(run, split, value_set)}


def _controls_view(services: Services, run: dict[str, Any], split: str = "train") -> dict[str, Any]:
    """The error box (as a visitor may read it: `Services.public_text`), the buttons, the picker's labels and the
    split picker's choices: component updates (each costs the server a component built and the session's config
    updated), so sent only when the status, the error or the splits changed."""
    error = services.public_text(run.get("error"))
    return {"error": gr.Textbox(value=error, visible=bool(error)),
            "picker": gr.Dropdown(choices=run_choices(services.store)),
            "split": gr.Dropdown(choices=_splits(run) or [split], value=split),
            **dict(zip(("stop", "resume", "delete"), _button_updates(run), strict=True))}


def _stats(store: Store, run: dict[str, Any], split: str) -> dict[str, Any]:
    """The split's aggregates of the run's own rows (`Store.value_stats`), once per change of them for every
    session."""
    version = (_count(run, split), run.get("values_revision"))
    return live.SHARED.get(("stats", run["id"], split), version, lambda _prev: store.value_stats(run["id"], split))


def _values_view(store: Store, run: dict[str, Any], value_set: dict[str, Any] | None, split: str) -> dict[str, Any]:
    if value_set is None or not _splits(run):
        stats = {"count": 0, "filtered": 0, "num_samples": 0, "mean_v_star": None, "correct": [],
                 "histogram": {"start": 0.0, "width": 1.0, "kept": [], "filtered": []}}
        view = values.render(stats, [], split, None, None)
    else:
        summary = (value_set.get("summary") or {}).get(split) or value_set.get("summary")
        expected = _expected_prompts(run)
        note = f" (of {expected}, still estimating)" if expected and run.get("stage") == "values" else ""
        view = values.render(_stats(store, run, split), _splits(run), split,
                             summary if isinstance(summary, dict) else None, run.get("best_eval_accuracy"), note,
                             values.band_of(run))
    return {k: _plot(v) if k in ("histogram", "correct_bar", "pass_rates") else v for k, v in view.items()}


def _page(store: Store, run: dict[str, Any], split: str, order: str, search: str | None,
          filtered: bool | None = None) -> list[dict[str, Any]]:
    """One page of the run's table, shared per (split, order, search). In stage-1 order without a search, while
    the run's rows are only added after the last one (its revision unchanged), a page that is full never changes
    and one that is not only needs the rows added since; anything else reads the page again."""
    sort, descending = values.ORDERS.get(order, ("id", False))
    version = (_count(run, split), run.get("values_revision"))
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


def _table_view(store: Store, run: dict[str, Any] | None, split: str, order: str,
                search: str | None) -> dict[str, Any]:
    if not _splits(run):
        return {"table_info": "", "table": values.values_frame([], 0)}
    return values.render_table(_page(store, run, split, order, search), _stats(store, run, split), order, search)


def _filtered_view(store: Store, run: dict[str, Any] | None, split: str) -> dict[str, Any]:
    if not _splits(run):
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


def _eval_pass_rates(store: Store, run: dict[str, Any], ids: dict[str, int],
                     value_set: dict[str, Any] | None) -> dict[str, float]:
    """The reference pass@1 and pass@N drawn beside the eval accuracy: on the held-out prompts it is measured on
    (their stage-1 split, "eval"), else none (the training prompts' rates would compare different prompts)."""
    def compute(_previous: Any) -> dict[str, float]:
        if value_set is None or not _count(run, "eval"):
            return {}
        summary = ((value_set.get("summary") or {}).get("eval")) if isinstance(value_set.get("summary"), dict) else None
        return values.ceilings(_stats(store, run, "eval"), summary if isinstance(summary, dict) else None)

    version = (ids["evaluations"], _count(run, "eval"), run.get("values_revision"))
    return live.SHARED.get(("eval-rates", run["id"]), version, compute)


def _training_view(store: Store, run_id: int, ids: dict[str, int], chart: ChartOptions,
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
        return _plot(charts.training_figure_spec(series, smoothing=chart.smoothing, ceilings=ceilings, metrics=panels,
                                                 buckets=buckets, x_title=x_title, log_y=chart.log_y))

    version = (ids["metrics"], tuple(sorted(ceilings.items())))
    plot = live.SHARED.get(("training", run_id, chart), version, figure)
    evaluations = live.SHARED.get(("evaluations", run_id), ids["evaluations"],
                                  lambda _prev: training.evaluations_frame(store.get_evaluations(run_id)))
    return {"plot": plot, "evaluations": evaluations}


def _samples_view(store: Store, run_id: int, sample_id: int, frame: Frame) -> dict[str, Any]:
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


def _logs_view(services: Services, run_id: int, log_id: int) -> dict[str, Any]:
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


# ------------------------------------------------------------------ the views, declared once


@dataclass(frozen=True)
class Frame:
    """One draw of the run in `snap` (`live.snapshot`) for one session's inputs: what every view is built from."""

    services: Services
    snap: dict[str, Any]
    chart: ChartOptions
    split: str
    order: str
    search: str | None
    correct: str
    text: str | None
    step: float | None
    sort: str = "prompt"
    latest: bool = True
    sample_split: str = "train"

    @classmethod
    def of(cls, services: Services, snap: dict[str, Any], chart: ChartOptions, split: str, order: str,
           search: str | None, correct: str, text: str | None, step: float | str | None, sort: str | None = None,
           latest: bool | None = True, sample_split: str | None = None) -> Frame:
        """The session's inputs as a draw reads them: the train split, stage-1 order and no search by default;
        the Samples tab on the latest step (its slider's value then read as none), sorted by prompt."""
        latest = latest is not False
        return cls(services, snap, chart, split or "train", order if order in values.ORDERS else "stage-1 order",
                   (search or "").strip() or None, correct, text, None if latest or step == "" else step,
                   sort if sort in completions.SORTS else "prompt", latest, sample_split or "train")

    @property
    def store(self) -> Store:
        return self.services.store

    @property
    def run(self) -> dict[str, Any]:
        return self.snap["run"]

    def version(self, view: View) -> tuple[Any, ...]:
        """What `view` would show: the run's changes it follows and the session's inputs it reads."""
        first_page = view.first_page_changes is not None and self.order == "stage-1 order" and not self.search
        changes = view.first_page_changes if first_page else view.changes
        return (changes(self.snap), *(getattr(self, name) for name in view.inputs))


@dataclass(frozen=True)
class View:
    """One part of the Run page. `tab`: the tab it is on (None: above the tabs, always drawn). `group`: the poller's
    group that redraws it (views of one group share a tab). `outputs`: the components it fills, by their names in
    `build_run_page`. `changes(snapshot)`: what moves it, the same for every session (the poller compares it);
    `inputs`: the session's inputs (`Frame` fields) it also reads. `build(frame)`: its outputs (a dict that may hold
    more). `first_page_changes`: what moves it while it shows the first page in stage-1 order, if that differs.
    `with_header`: its group redraws the header too (one event instead of two; False for a group that only moves
    along with one that does)."""

    name: str
    tab: str | None
    group: str
    outputs: tuple[str, ...]
    changes: Callable[[dict[str, Any]], tuple[Any, ...]]
    build: Callable[[Frame], dict[str, Any]]
    inputs: tuple[str, ...] = ()
    first_page_changes: Callable[[dict[str, Any]], tuple[Any, ...]] | None = None
    with_header: bool = True


def _rows(snap: dict[str, Any]) -> tuple[Any, ...]:
    """The run's own V* rows: their value set, count per split, a revision that moves with any rewrite of them,
    and whether the set is complete."""
    run, value_set = snap["run"], snap["value_set"]
    return (run.get("value_set_id"), tuple(sorted((run.get("value_counts") or {}).items())),
            run.get("values_revision"), bool(value_set and value_set["complete"]))


def _header_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    run = snap["run"]
    active = run["status"] in UNFINISHED  # the elapsed time moves every 10 s while the run is active
    return (run["status"], run.get("stage"), round(run.get("progress") or 0, 3), snap["ids"]["evaluations"],
            *_rows(snap), int(time.time() // 10) if active else 0)


def _controls_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    run = snap["run"]
    # The error's checksum, not its text: versions go to every browser that polls.
    return run["status"], zlib.crc32((run.get("error") or "").encode()), tuple(_splits(run))


def _summary_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    return *_rows(snap), str((snap["value_set"] or {}).get("summary")), snap["run"].get("stage") == "values"


def _charts_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    return *_rows(snap), str((snap["value_set"] or {}).get("summary")), snap["run"].get("best_eval_accuracy")


def _first_page_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    """A full first page in stage-1 order moves only when the run's rows are rewritten, not when rows are added
    after it."""
    counts = (snap["run"].get("value_counts") or {}).values()
    value_set_id, _, revision, complete = _rows(snap)
    full = bool(counts) and all(n >= values.PAGE_ROWS for n in counts)
    return ("full", value_set_id, revision, complete) if full else _rows(snap)


def _training_changes(snap: dict[str, Any]) -> tuple[Any, ...]:
    run, ids = snap["run"], snap["ids"]
    # The reference's pass rates drawn beside the eval accuracy move with the run's held-out V* rows.
    return ids["metrics"], ids["evaluations"], _count(run, "eval"), run.get("values_revision")


def _build_header(frame: Frame) -> dict[str, Any]:
    run, split = frame.run, frame.split
    return live.SHARED.get(("header", run["id"], split), (_header_changes(frame.snap), split),
                           lambda _prev: _header_view(frame.store, run, frame.snap["value_set"], split))


def _build_values(frame: Frame) -> dict[str, Any]:
    """The V* tab's summary and charts, computed together once per change of either for every session."""
    run, split = frame.run, frame.split
    version = (_summary_changes(frame.snap), _charts_changes(frame.snap), split)
    return live.SHARED.get(("values", run["id"], split), version,
                           lambda _prev: _values_view(frame.store, run, frame.snap["value_set"], split))


def _build_training(frame: Frame) -> dict[str, Any]:
    run, ids = frame.run, frame.snap["ids"]
    ceilings = _eval_pass_rates(frame.store, run, ids, frame.snap["value_set"])
    return _training_view(frame.store, run["id"], ids, frame.chart, ceilings)


VIEWS: dict[str, View] = {view.name: view for view in (
    View("header", tab=None, group="head", outputs=("header", "progress"), changes=_header_changes,
         build=_build_header, inputs=("split",)),
    View("controls", tab=None, group="controls", outputs=("error", "stop", "resume", "delete", "picker", "split"),
         changes=_controls_changes, build=lambda f: _controls_view(f.services, f.run, f.split), inputs=("split",)),
    View("summary", tab="values", group="values", outputs=("summary",), changes=_summary_changes,
         build=_build_values, inputs=("split",)),
    View("charts", tab="values", group="values", outputs=("histogram", "correct_bar", "pass_rates"),
         changes=_charts_changes, build=_build_values, inputs=("split",)),
    View("table_info", tab="values", group="values", outputs=("table_info",), changes=_rows,
         build=lambda f: _table_view(f.store, f.run, f.split, f.order, f.search), inputs=("split", "order", "search")),
    View("table", tab="values", group="table", outputs=("table",), changes=_rows,
         build=lambda f: _table_view(f.store, f.run, f.split, f.order, f.search), inputs=("split", "order", "search"),
         first_page_changes=_first_page_changes, with_header=False),
    View("filtered", tab="filtered", group="filtered", outputs=("filtered_summary", "filtered_table"),
         changes=_rows, build=lambda f: _filtered_view(f.store, f.run, f.split), inputs=("split",)),
    View("training", tab="training", group="training", outputs=("plot", "evaluations"), changes=_training_changes,
         build=_build_training, inputs=("chart",)),
    View("samples", tab="samples", group="samples",
         outputs=("samples", "samples_info", "samples_step", "samples_latest", "samples_split"),
         changes=lambda snap: (snap["ids"]["samples"],),
         inputs=("correct", "text", "step", "sort", "latest", "sample_split"),
         build=lambda f: _samples_view(f.store, f.run["id"], f.snap["ids"]["samples"], f)),
    View("logs", tab="logs", group="logs", outputs=("logs",), changes=lambda snap: (snap["ids"]["logs"],),
         build=lambda f: _logs_view(f.services, f.run["id"], f.snap["ids"]["logs"])),
)}

# ------------------------------------------------------------------ derived from VIEWS

HEADER = VIEWS["header"]
# Outputs of `refresh`, in the order of `build_run_page`'s outputs list.
OUTPUTS = ("state", "timer", *dict.fromkeys(name for view in VIEWS.values() for name in view.outputs))
TABS = tuple(dict.fromkeys(view.tab for view in VIEWS.values() if view.tab is not None))
# What a session sees with each tab open: the views above the tabs and the tab's.
ON_TAB = {tab: tuple(view for view in VIEWS.values() if view.tab in (None, tab)) for tab in TABS}
# The poller's last word once it saw an end twice (see the poller): the header and the timer (off) from one snapshot,
# so the page always ends on the end, even when an earlier header draw was dropped or read a snapshot from before it
# on a busy server (a visitor's page stuck on "running" after the owner's stop).
IDLE = "idle"


def _own_views() -> dict[str, tuple[View, ...]]:
    """Each poller group's views (those whose changes make its version), in the order of `VIEWS`."""
    groups: dict[str, tuple[View, ...]] = {}
    for view in VIEWS.values():
        groups[view.group] = (*groups.get(view.group, ()), view)
    for group, views in groups.items():
        if len({view.tab for view in views}) > 1:
            raise ValueError(f"The Run page's views {[v.name for v in views]} share the poller group {group!r} but "
                             "not a tab: give the views of each tab their own group.")
    return groups


GROUP_OWN = _own_views()
GROUP_TAB = {group: views[0].tab for group, views in GROUP_OWN.items()}
# What each group draws: each group is its own Gradio event with exactly its outputs (an output left out with
# `gr.skip()` still costs the server a component built and its config regenerated, which adds up over a page's many
# outputs), drawn when its version in `run_version` moved and its tab (None: any) is open.
GROUP_VIEWS = {**{group: (HEADER, *views) if GROUP_TAB[group] is not None and all(v.with_header for v in views)
                  else views for group, views in GROUP_OWN.items()},
               IDLE: (HEADER,)}
GROUPS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    group: (GROUP_TAB.get(group), (*dict.fromkeys(name for view in views for name in view.outputs),
                                   *(("timer",) if group == IDLE else ())))
    for group, views in GROUP_VIEWS.items()}
# The poller's one config object (see app/web/static/run_poller.js).
POLLER_CONFIG = {
    "redraw_ms": int(LIVE_REDRAW_SECONDS * 1000),
    "active_statuses": sorted(UNFINISHED),
    "group_tabs": GROUP_TAB,
    "head": HEADER.group,
    "groups_with_head": [group for group in GROUP_TAB if group != HEADER.group and HEADER in GROUP_VIEWS[group]],
    "first_page_groups": [group for group, views in GROUP_OWN.items() if any(v.first_page_changes for v in views)],
}
POLLER_SOURCE = resources.files("app.web").joinpath("static", "run_poller.js").read_text(encoding="utf-8")
POLLER_JS = f"() => ({POLLER_SOURCE.strip()})({json.dumps(POLLER_CONFIG)})"


# ------------------------------------------------------------------ drawing


def run_version(store: Store, run_id: int) -> dict[str, str]:
    """What a page on `run_id` could show, group by group (see `GROUPS`), as short strings from the shared snapshot:
    the page's poller compares them with the last ones and redraws only the groups that moved. A group with a view
    whose first page in stage-1 order stops changing once full also has `<group>_first`."""
    snap = live.snapshot(store, int(run_id))
    if snap is None:
        return {"status": "gone"}

    def joined(parts: list[tuple[Any, ...]]) -> str:
        return "|".join(str(x) for part in parts for x in part)

    versions = {"status": snap["run"]["status"]}
    for group, views in GROUP_OWN.items():
        versions[group] = joined([view.changes(snap) for view in views])
        if group in POLLER_CONFIG["first_page_groups"]:
            versions[f"{group}_first"] = joined([(view.first_page_changes or view.changes)(snap) for view in views])
    return versions


def draw_group(services: Services, group: str, run_id: int | None, chart: ChartOptions, split: str, order: str,
               search: str | None, correct: str, text: str | None, step: float | None, sort: str | None = None,
               latest: bool | None = True, sample_split: str | None = None) -> list[Any]:
    """One group's outputs (see `GROUPS`) for the poller: no session state is read or written (the poller decided
    what moved); each value comes from what every session shares (`live.SHARED`)."""
    snap = live.snapshot(services.store, run_id) if run_id is not None else None
    names = GROUPS[group][1]
    if snap is None:
        return [gr.skip()] * len(names)
    frame = Frame.of(services, snap, chart, split, order, search, correct, text, step, sort, latest, sample_split)
    out: dict[str, Any] = {}
    for view in GROUP_VIEWS[group]:
        built = view.build(frame)
        out.update({name: built[name] for name in view.outputs})
    if group == IDLE:
        out["timer"] = gr.Timer(POLL_SECONDS, active=frame.run["status"] in UNFINISHED)
    return [out.get(name, gr.skip()) for name in names]


def refresh(services: Services, run_id: int | None, state: dict[str, Any] | None, chart: ChartOptions, split: str,
            order: str, search: str | None, correct: str, text: str | None, step: float | None,
            sort: str | None = None, latest: bool | None = True, sample_split: str | None = None,
            tab: str | None = None) -> list[Any]:
    """Draw what moved since `state` (a tab switch, a filter change, a new run picked): updates for the
    `OUTPUTS`, where only the views on screen (`ON_TAB`: above the tabs and the selected tab's) whose version moved
    since `state` are sent, everything else `gr.skip()`."""
    if state is None or state.get("run_id") != run_id:
        state = new_state(run_id, (state or {}).get("tab", "values"))
    if tab is not None:
        state["tab"] = tab
    out: dict[str, Any] = {"state": state}
    snap = live.snapshot(services.store, run_id) if run_id is not None else None
    if snap is None:
        _set_timer(state, out, False)
        if not state["shown"].get("empty"):
            state["shown"] = {"empty": True}
            out.update(_no_run(services.store, split or "train"))
        return _updates(out)

    frame = Frame.of(services, snap, chart, split, order, search, correct, text, step, sort, latest, sample_split)
    shown = state["shown"]
    for view in ON_TAB[state["tab"]]:
        version = frame.version(view)
        if shown.get(view.name) != version:
            built = view.build(frame)
            out.update({name: built[name] for name in view.outputs})
            shown[view.name] = version
    shown.pop("empty", None)
    _set_timer(state, out, frame.run["status"] in UNFINISHED, rearm=True)
    return _updates(out)


def _no_run(store: Store, split: str) -> dict[str, Any]:
    """The page with no run picked."""
    return {"header": "Pick a run above, launch one, or open one from the Runs page.", "progress": "",
            "error": gr.Textbox(visible=False, value=""), "logs": "",
            "plot": _plot(charts.empty_spec("No run selected")), "evaluations": None, "samples": None,
            "samples_info": "", "samples_step": completions.step_slider([], None), "samples_latest": True,
            "samples_split": gr.Radio(choices=["train"], value="train"),
            "picker": gr.Dropdown(choices=run_choices(store)),
            **_values_view(store, {}, None, split), **_table_view(store, None, "", "", None),
            **_filtered_view(store, None, ""),
            **dict(zip(("stop", "resume", "delete"), _button_updates(None), strict=True))}


def _set_timer(state: dict[str, Any], out: dict[str, Any], active: bool, rearm: bool = False) -> None:
    """Switch the page's timer on or off when the run's activity changed; with `rearm` (a click of the user on a
    live run) send its state again, so a timer the browser dropped comes back (we saw that once, after a quick
    succession of tab clicks; an update that repeats its state costs the page nothing)."""
    if state["polling"] != active or (active and rearm):
        state["polling"] = active
        out["timer"] = gr.Timer(POLL_SECONDS, active=active)


def _updates(out: dict[str, Any]) -> list[Any]:
    return [out.get(name, gr.skip()) for name in OUTPUTS]


# ------------------------------------------------------------------ layout


def build_run_page(services: Services, token: Any = None) -> RunPage:
    """The run page: picker, header, progress, stop/resume/delete, and the V*/Filtered/Training/Samples/Logs tabs.
    `token` is the login's browser state: Stop, Resume and Delete are checked like the API's (`Services.act`)."""
    token = token if token is not None else gr.State(None)
    with gr.Row():
        picker = gr.Dropdown(choices=run_choices(services.store), value=None, label="Run", scale=4,
                             elem_id="run-picker")
        # Disabled until a run is picked (`_button_updates`): there is nothing to act on yet.
        stop_btn = gr.Button("Stop", variant="stop", size="sm", scale=0, min_width=90, elem_id="run-stop",
                             interactive=False)
        resume_btn = gr.Button("Resume", size="sm", scale=0, min_width=90, elem_id="run-resume", interactive=False)
        delete_btn = gr.Button("Delete", size="sm", scale=0, min_width=90, elem_id="run-delete", interactive=False)
        clone_btn = gr.Button("Clone into the Launch form", size="sm", scale=0, min_width=140, elem_id="run-clone")
    head = gr.Markdown("Pick a run above, launch one, or open one from the Runs page.", elem_id="run-header")
    progress = gr.HTML(elem_id="run-progress")
    error = gr.Textbox(label="Error", lines=8, max_lines=20, visible=False, interactive=False, elem_id="run-error")
    action_msg = gr.Markdown(elem_id="run-action")
    with gr.Tabs(selected="values", elem_id="run-tabs"):
        vtab = values.build_values_tabs()
        ttab = training.build_training_tab()
        stab = completions.build_samples_tab()
        with gr.Tab("Logs", id="logs", elem_id="tab-logs") as logs_tab:
            logs = gr.Textbox(lines=18, max_lines=18, autoscroll=True, interactive=False, show_label=False,
                              elem_id="run-logs")
    state = gr.State(None)
    timer = gr.Timer(POLL_SECONDS, active=False)  # on while the picked run is active
    # The components the views fill (`View.outputs`) and the tabs they are on, by name.
    components = {"state": state, "timer": timer, "header": head, "progress": progress, "error": error,
                  **vtab.outputs(), "plot": ttab.plot, "evaluations": ttab.evaluations, "samples": stab.table,
                  "samples_info": stab.info, "samples_step": stab.step, "samples_latest": stab.latest,
                  "samples_split": stab.split, "logs": logs, "stop": stop_btn, "resume": resume_btn,
                  "delete": delete_btn, "picker": picker}
    tabs = {"values": vtab.values_tab, "filtered": vtab.filtered_tab, "training": ttab.tab, "samples": stab.tab,
            "logs": logs_tab}
    chart_inputs = ttab.controls()  # smoothing, x axis, log scale
    filters = [vtab.split, vtab.order, vtab.search, *stab.filters()]
    _add_redraws(services, picker, timer, components, chart_inputs, filters)
    triggers = (vtab.split.change, vtab.order.change, vtab.search.submit, ttab.smoothing.release, ttab.x_axis.change,
                ttab.log_y.change, stab.correct.change, stab.text.submit, stab.sort.change, stab.latest.input,
                stab.split.input)
    _add_refreshes(services, picker, state, components, tabs, chart_inputs, filters, triggers)
    _add_step_pick(services, picker, state, components, chart_inputs, filters, stab)
    _add_details(services, picker, vtab, ttab, stab)
    _add_actions(services, picker, token, timer, action_msg, {"stop": stop_btn, "resume": resume_btn,
                                                              "delete": delete_btn})
    return RunPage(picker=picker, state=state, timer=timer, clone=clone_btn)


def _add_redraws(services: Services, picker: gr.Dropdown, timer: gr.Timer, components: dict[str, Any],
                 chart_inputs: list[Any], filters: list[Any]) -> None:
    """The poller: the timer's event runs in the browser only (`POLLER_JS`): no Gradio event (each costs the page a
    walk over every component of the app), just a request to `run_version`; a group is redrawn by a Gradio event
    (its hidden button's click) when it moved. They are callable by clients (benchmarks/polling_cost.py simulates a
    class with them); they read only what any viewer of the page may see."""
    draw_buttons = {group: gr.Button(group, visible="hidden", elem_id=f"run-draw-{group}") for group in GROUPS}

    def drawer(group: str):
        def handler(run_id, smoothing, x_axis, log_y, *rest):
            updates = draw_group(services, group, run_id, ChartOptions.of(smoothing, x_axis, log_y), *rest)
            # One output takes the value itself: a list of one would be read as a table of one row.
            return updates[0] if len(updates) == 1 else updates
        return handler

    def version(run_id: int) -> dict[str, str]:
        """The run's versions (see `run_version`): what the page's poller asks every few seconds."""
        return run_version(services.store, run_id)

    timer.tick(None, None, None, js=POLLER_JS)
    gr.api(version, api_name="run_version", api_visibility="undocumented", concurrency_limit=None)
    # A click while the group's last draw is still running (a busy server) draws once more after it: with Gradio's
    # default for buttons the click would be dropped, and the poller, which counts the change as drawn, would leave
    # the page showing the state before it.
    draw_inputs = [picker, *chart_inputs, *filters]
    for group, button in draw_buttons.items():
        button.click(drawer(group), draw_inputs, [components[name] for name in GROUPS[group][1]],
                     api_name=f"run_draw_{group}", api_visibility="undocumented", trigger_mode="always_last",
                     show_progress="hidden", concurrency_limit=None)


def _add_refreshes(services: Services, picker: gr.Dropdown, state: gr.State, components: dict[str, Any],
                   tabs: dict[str, Any], chart_inputs: list[Any], filters: list[Any], triggers: tuple) -> None:
    """A session's own events: a run picked, a tab opened, a filter changed (`refresh`)."""
    inputs = [picker, state, *chart_inputs, *filters]
    outputs = [components[name] for name in OUTPUTS]
    # Only a change of the picker draws the page without a run. Any other event that finds no run picked was
    # triggered before the picker's new value reached it (the Run tab opening from a click on the Runs page); run
    # beside the picker's reload, it could finish last and blank the page that reload drew.
    nothing = [gr.skip()] * len(outputs)

    def update(run_id, state, smoothing, x_axis, log_y, *rest):
        if run_id is None:
            return nothing
        return refresh(services, run_id, state, ChartOptions.of(smoothing, x_axis, log_y), *rest)

    def reload(run_id, state, smoothing, x_axis, log_y, *rest):
        tab = (state or {}).get("tab", "values")
        return refresh(services, run_id, new_state(run_id, tab), ChartOptions.of(smoothing, x_axis, log_y), *rest)

    def select(tab: str):
        def handler(run_id, state, smoothing, x_axis, log_y, *rest):
            if run_id is None:  # remember the tab for the run picked next; draw nothing
                return [{**(state or new_state(None)), "tab": tab}, *nothing[1:]]
            return refresh(services, run_id, state, ChartOptions.of(smoothing, x_axis, log_y), *rest, tab=tab)
        return handler

    private = {"show_progress": "hidden", "concurrency_limit": None, "api_visibility": "private"}
    picker.change(reload, inputs, outputs, **private)
    picker.change(None, None, None, js=SHOW_RUN_TAB)  # a run picked here, launched or clicked on the Runs page
    for trigger in triggers:
        trigger(update, inputs, outputs, **private)
    for tab_id in TABS:
        tabs[tab_id].select(select(tab_id), inputs, outputs, **private)


def _add_step_pick(services: Services, picker: gr.Dropdown, state: gr.State, components: dict[str, Any],
                   chart_inputs: list[Any], filters: list[Any], stab: completions.SamplesTab) -> None:
    """The Samples tab's slider let go: that step is shown, and no longer the latest (its box unticked by the
    draw), so a live run's new steps leave it where the user put it."""
    latest = filters.index(stab.latest)

    def pick(run_id, state, smoothing, x_axis, log_y, *rest):
        if run_id is None:
            return [gr.skip()] * len(OUTPUTS)
        rest = [False if i == latest else value for i, value in enumerate(rest)]
        return refresh(services, run_id, state, ChartOptions.of(smoothing, x_axis, log_y), *rest)

    stab.step.release(pick, [picker, state, *chart_inputs, *filters], [components[name] for name in OUTPUTS],
                      show_progress="hidden", concurrency_limit=None, api_visibility="private")


def _add_details(services: Services, picker: gr.Dropdown, vtab: Any, ttab: Any,
                 stab: completions.SamplesTab) -> None:
    """The training tab's download, a prompt's reference completions (V* tab) and a prompt's completions across
    steps (Samples tab), on request."""

    def chart_data(run_id: int | None):
        """Every logged metric of the run, one row per (step, name), as the Export page writes it."""
        from app.web.pages.export import write_csv

        if run_id is None:
            return gr.File(visible=False)
        return gr.File(value=str(write_csv(services, "metrics", int(run_id))), visible=True)

    ttab.download.click(chart_data, picker, ttab.data_file, api_visibility="private")

    def show_prompt(run_id: int | None, split: str, evt: gr.SelectData):
        run = services.store.get_run(run_id) if run_id is not None else None
        if run is None or not evt.row_value:
            return gr.skip(), gr.skip()
        prompt_id = str(evt.row_value[0])
        return values.prompt_detail(services.store.get_value(run["id"], split or "train", prompt_id), prompt_id)

    vtab.table.select(show_prompt, [picker, vtab.split], [vtab.prompt_text, vtab.completions],
                      api_visibility="private")

    def prompt_history(run_id: int | None, split: str, evt: gr.SelectData):
        if run_id is None or not evt.row_value:
            return gr.skip(), gr.skip()
        prompt_id = str(evt.row_value[completions.STEP_COLUMNS.index("prompt")])
        rows = services.store.prompt_samples(int(run_id), prompt_id, split or "train")
        return completions.prompt_heading(rows, prompt_id), completions.history_frame(rows)

    stab.table.select(prompt_history, [picker, stab.split], [stab.prompt, stab.history], api_visibility="private")


def _add_actions(services: Services, picker: gr.Dropdown, token: Any, timer: gr.Timer, message: gr.Markdown,
                 buttons: dict[str, gr.Button]) -> None:
    """Stop, Resume and Delete, checked like the API's (`Services.act`: own runs, or any as admin)."""

    def act(action: str):
        def handler(run_id: int | None, token_value: str | None, request: gr.Request):
            if run_id is None:
                return "Pick a run first.", gr.skip(), gr.skip()
            user = services.auth.identify(token=token_value, request=request)
            try:
                services.act(action, run_id, user)
            except (ValueError, KeyError, RuntimeError) as exc:
                return f"❌ {exc}", gr.skip(), gr.skip()
            live.forget_run(run_id)
            if action == "delete":
                return (f"🗑 Deleted run #{run_id}.", gr.Dropdown(choices=run_choices(services.store), value=None),
                        gr.Timer(POLL_SECONDS, active=False))
            # A resumed run is queued again: poll it (the next poll also redraws its header and buttons).
            return (f"✅ {action.capitalize()} requested for run #{run_id}.",
                    gr.Dropdown(choices=run_choices(services.store), value=run_id),
                    gr.Timer(POLL_SECONDS, active=True))
        return handler

    for action, button in buttons.items():
        button.click(act(action), [picker, token], [message, picker, timer], api_visibility="private")
