"""Run page: one run, live while it works.

A `gr.Timer` ticks every `POLL_SECONDS` while the run is active (queued, running, stopping) and is switched off
(`gr.Timer(active=False)`) once it is not: a finished, failed, stopped or interrupted run costs nothing while its
page stays open. Picking an active run, or resuming this one, switches it on again.

A tick is cheap, on both sides. Its event runs in the browser only (`POLLER_JS`): a Gradio event, even one that
changes nothing, makes the page walk every component of the app twice (their loading status), which is costly
on this page; so the tick only asks `run_version` for a short string saying what the run
could show, read from a snapshot shared by every session (`live.snapshot`, read at most once a second). When it
moved, the poller clicks a hidden Redraw button (at most every `LIVE_REDRAW_SECONDS`, at once when the status
changed), and that Gradio event (`refresh`) sends only the views on screen whose version moved: the header and the
selected tab (the others catch up when their tab is opened). Each session keeps in a `gr.State` only the run id,
the selected tab and one version per view. What a view shows is computed once per version for all sessions
(`live.SHARED`): the V* aggregates and the table page once per stage-1 batch, the training figure once per new
metric rows, each fetched incrementally (rows newer than the last id) where that is possible.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from typing import Any

import gradio as gr
from gradio.components.plot import PlotData

from app.access.gate import Services
from app.web import charts, live
from app.web.common import (
    Remaining,
    clock_from_metrics,
    elapsed_seconds,
    estimate_remaining,
    format_duration,
    format_time,
    progress_bar,
    run_choices,
    status_badge,
    training_seconds,
)
from app.web.pages import training, values
from storage import Store
from storage.lifecycle import LIVE, UNFINISHED
from storage.secrets import scrub_text

POLL_SECONDS = 2.5
# Opens the Run page's tab (its button's id comes from the tab's elem_id "page-run" in app.web): run in the browser,
# since a Gradio event with the main tabs as an output would make every later event walk the whole app.
SHOW_RUN_TAB = "() => { document.getElementById('page-run-button')?.click(); return []; }"
MAX_LOG_LINES = 300
SEARCH_WINDOW = 100_000
MAX_POINTS = charts.MAX_POINTS
TABS = ("values", "filtered", "training", "samples", "logs")
# Outputs of `refresh`, in the order of `build_run_page`'s outputs list (each a component there).
OUTPUTS = ("state", "timer", "header", "progress", "error", "summary", "split", "histogram", "correct_bar",
           "pass_rates", "table_info", "table", "filtered_summary", "filtered_table", "plot", "evaluations",
           "samples", "samples_info", "logs", "stop", "resume", "delete", "picker")


@dataclass
class RunPage:
    picker: gr.Dropdown
    state: gr.State
    timer: gr.Timer
    clone: gr.Button


@dataclass(frozen=True)
class ChartOptions:
    """How the Training tab draws its curves: EMA smoothing, x by "step" or "time", log-scale y."""

    smoothing: float = 0.6
    x_axis: str = "step"
    log_y: bool = False

    @classmethod
    def of(cls, smoothing: float | None, x_axis: str | None, log_y: bool | None) -> ChartOptions:
        return cls(float(smoothing if smoothing is not None else 0.6), "time" if x_axis == "time" else "step",
                   bool(log_y))


def new_state(run_id: int | None, tab: str = "values") -> dict[str, Any]:
    """What a session shows for `run_id`: nothing yet (one version per view, set once drawn; `polling`: whether
    the page's timer is on, None while unknown, so the first refresh sets it either way)."""
    return {"run_id": run_id, "tab": tab, "polling": None, "shown": {}}


def stage_progress(run: dict[str, Any], num_values: int, value_set: dict[str, Any] | None) -> str:
    """Two progress bars: stage 1 (V* estimation) and stage 2 (training, or evaluation for evaluate runs)."""
    action, stage, status = run["action"], run.get("stage"), run["status"]
    progress = run.get("progress") or 0.0
    done = status == "finished"
    expected = _expected_prompts(run)
    if value_set is not None and value_set.get("complete"):
        s1, d1 = 1.0, f"{num_values} prompts"
    elif stage == "values":
        s1 = progress
        d1 = f"{num_values} / {expected} prompts" if expected else f"{num_values} prompts"
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


def header(run: dict[str, Any], evaluations: list[dict[str, Any]] | None = None,
           clock: dict[str, float] | None = None) -> str:
    """The run's title line and facts: its times (wall time since it started; training time and the remaining
    estimate from its clock, `clock_from_metrics`) and its accuracy before and after training."""
    done = len({e["step"] for e in evaluations or []})
    estimate = estimate_remaining(run, clock, done or None)
    parts = [f"### #{run['id']} {html.escape(run['name'])} {status_badge(run['status'])}",
             f"**{run['action']}** · model `{run['model']}` · dataset `{run['dataset']}` · stage "
             f"`{run.get('stage') or '–'}` · created {format_time(run['created_at'])} · wall time "
             f"{format_duration(elapsed_seconds(run))} · training time {format_duration(training_seconds(clock))} · "
             + remaining_text(estimate)]
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


# ------------------------------------------------------------------ views, computed once per version


def _header_view(store: Store, run: dict[str, Any], value_set: dict[str, Any] | None,
                 split: str) -> dict[str, Any]:
    marker = f'<div id="run-live" data-run="{int(run["id"])}" hidden></div>'  # the run the poller asks about
    evaluations = store.get_evaluations(run["id"]) if run.get("best_eval_accuracy") is not None else []
    return {"header": header(run, evaluations, clock_from_metrics(store.latest_metrics(run["id"]))),
            "progress": marker + stage_progress(run, _count(run, split), value_set)}


def _public(text: str | None, jobs: Any) -> str:
    """What a visitor reads of a text a process wrote: the scheduler's scrubber (`Scheduler.public_text`)."""
    public = getattr(jobs, "public_text", None)
    return public(text) if public is not None else scrub_text(text)


def _controls_view(store: Store, run: dict[str, Any], jobs: Any = None) -> dict[str, Any]:
    """The error box, the buttons and the picker's labels: component updates (each costs the server a component
    built and the session's config updated), so sent only when the status or the error changed."""
    error = _public(run.get("error"), jobs)
    return {"error": gr.Textbox(value=error, visible=bool(error)), "picker": gr.Dropdown(choices=run_choices(store)),
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
                             summary if isinstance(summary, dict) else None, run.get("best_eval_accuracy"), note)
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
    names = [name for name, _ in charts.TRAINING_METRICS]

    def compute(previous: dict[str, Any] | None) -> dict[str, Any]:
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
        return _plot(charts.training_figure_spec(series, smoothing=chart.smoothing, ceilings=ceilings,
                                                 buckets=buckets, x_title=x_title, log_y=chart.log_y))

    version = (ids["metrics"], tuple(sorted(ceilings.items())))
    plot = live.SHARED.get(("training", run_id, chart), version, figure)
    evaluations = live.SHARED.get(("evaluations", run_id), ids["evaluations"],
                                  lambda _prev: training.evaluations_frame(store.get_evaluations(run_id)))
    return {"plot": plot, "evaluations": evaluations}


def _samples_view(store: Store, run_id: int, sample_id: int, query: dict[str, Any]) -> dict[str, Any]:
    """The newest `MAX_SAMPLES` samples matching the filters; later polls fetch only rows newer than the last.
    A text or step filter looks through the newest `SEARCH_WINDOW` sample ids only: a substring has no index, and
    a search through a million samples is slow (the CSV export has them all)."""
    filtered = query.get("text") is not None or query.get("step") is not None
    floor = max(0, sample_id - SEARCH_WINDOW) if filtered else 0

    def compute(previous: tuple[int, list[dict[str, Any]]] | None) -> tuple[int, list[dict[str, Any]]]:
        after = previous[0] if previous is not None and previous[0] <= sample_id else 0
        new = store.get_samples(run_id, after_id=max(after, floor), limit=training.MAX_SAMPLES, newest_first=True,
                                **query)
        rows = (new + (previous[1] if after else []))[: training.MAX_SAMPLES]
        return sample_id, rows

    key = ("samples", run_id, tuple(sorted(query.items())))
    rows = live.SHARED.get(key, sample_id, compute)[1]
    info = f"{len(rows)} completions shown (newest first, at most {training.MAX_SAMPLES})."
    if floor:
        info += f" Filters search the newest {SEARCH_WINDOW:,} samples; export the samples (CSV) for all of them."
    return {"samples": training.samples_frame(rows), "samples_info": info}


def _logs_view(store: Store, run_id: int, log_id: int, jobs: Any = None) -> dict[str, Any]:
    def compute(previous: tuple[int, list[str]] | None) -> tuple[int, list[str]]:
        after, lines = (previous[0], previous[1]) if previous is not None and previous[0] <= log_id else (0, [])
        if not after:
            after = max(0, log_id - MAX_LOG_LINES)  # ids of one run grow by one per line: the last page at most
        new = [f"{format_time(x['created_at'])} {x['level']:7} {_public(x['message'], jobs)}"
               for x in store.get_logs(run_id, after_id=after, limit=None)]
        return log_id, (lines + new)[-MAX_LOG_LINES:]

    text = "\n".join(live.SHARED.get(("logs", run_id), log_id, compute)[1])
    run = store.get_run(run_id)
    if getattr(getattr(jobs, "backend", None), "name", None) == "ray" and run and run.get("ray_job_id"):
        # A Ray run's worker output is the job's log, on the cluster (a local worker's is a file of the data folder).
        output = live.SHARED.get(("ray-logs", run_id), log_id,
                                 lambda _prev: _public(jobs.worker_output(run_id, run, 40), jobs))
        text += f"\n\n--- output of Ray job {run['ray_job_id']} (last lines) ---\n{output}"
    return {"logs": text}


# ------------------------------------------------------------------ one poll

# How often a page on a live run redraws at most (a run writes every second or two); a change of status at once.
LIVE_REDRAW_SECONDS = 5.0
TAB_VIEWS = {"values": ("summary", "charts", "table_info", "table"), "filtered": ("filtered",),
             "training": ("training",), "samples": ("samples",), "logs": ("logs",)}
# What the poller redraws, group by group: each group is its own Gradio event with exactly its outputs (an output
# left out with `gr.skip()` still costs the server a component built and its config regenerated, which adds up
# over a page's many outputs), drawn when its version in `run_version` moved and its tab (None: any) is open.
# A tab's group redraws the header too (one event instead of two; "head" alone when nothing else moved).
HEAD = ("header", "progress")
GROUPS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "head": (None, HEAD),
    "controls": (None, ("error", "stop", "resume", "delete", "picker", "split")),
    # The poller's last word once it saw an end twice (see POLLER_JS): the header and the timer (off) from one
    # snapshot, so the page always ends on the end, even when an earlier header draw was dropped or read a snapshot
    # from before it on a busy server (a visitor's page stuck on "running" after the owner's stop).
    "idle": (None, (*HEAD, "timer")),
    "values": ("values", (*HEAD, "summary", "histogram", "correct_bar", "pass_rates", "table_info")),
    "table": ("values", ("table",)),
    "filtered": ("filtered", (*HEAD, "filtered_summary", "filtered_table")),
    "training": ("training", (*HEAD, "plot", "evaluations")),
    "samples": ("samples", (*HEAD, "samples", "samples_info")),
    "logs": ("logs", (*HEAD, "logs")),
}
# The page's poller (the timer's event, run in the browser only, see the module docstring): ask `run_version`, and
# click the hidden button of each group on screen whose version moved, at most every LIVE_REDRAW_SECONDS unless the
# run's status changed. The table's version depends on the order picked: the first page in stage-1 order stops
# changing once full.
POLLER_JS = r"""
async () => {
  const live = document.getElementById("run-live");
  if (!live) return [];
  const run = Number(live.dataset.run), now = Date.now();
  const root = ((window.gradio_config && window.gradio_config.root) || location.origin).replace(/\/$/, "");
  // One session for all of this page's polls: without one, each poll makes the server build a new session (CPU,
  // and memory kept per poll).
  window.__runPollSession = window.__runPollSession || "run-poll-" + Math.random().toString(36).slice(2);
  let versions = null;
  try {
    const post = await fetch(`${root}/gradio_api/call/run_version`, {method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({data: [run], session_hash: window.__runPollSession})});
    const event = (await post.json()).event_id;
    const answer = await (await fetch(`${root}/gradio_api/call/run_version/${event}`)).text();
    const data = answer.split("\n").find((line) => line.startsWith("data:"));
    versions = data ? JSON.parse(data.slice(5))[0] : null;
  } catch (error) {
    console.debug("run poll:", error);
  }
  if (!versions || !versions.status) return [];
  const seenBefore = window.__runLive;
  if (seenBefore && seenBefore.run === run && versions.status === seenBefore.versions.status
      && !ACTIVE_STATUSES.includes(versions.status)) {
    // This end was drawn at an earlier poll (from a snapshot at least as new): polling can stop.
    document.getElementById("run-draw-idle")?.click();
    return [];
  }
  const order = document.querySelector("#values-order input");
  const search = document.querySelector("#values-search textarea, #values-search input");
  const first = order && order.value === "stage-1 order" && !(search && search.value.trim());
  versions.table = first ? versions.table_first : versions.table;
  const seen = window.__runLive;
  if (!seen || seen.run !== run) {
    window.__runLive = {run: run, versions: versions, at: now};  // a run just picked: drawn then
    return [];
  }
  if (versions.status === seen.versions.status && now - seen.at < LIVE_REDRAW_MS) return [];
  const due = [];
  for (const [group, tab] of Object.entries(GROUP_TABS)) {
    if (versions[group] === seen.versions[group]) continue;
    const panel = tab && document.getElementById("tab-" + tab);
    if (!tab || (panel && panel.offsetParent !== null)) due.push(group);
    seen.versions[group] = versions[group];  // a hidden tab is drawn when it is opened
  }
  const withHead = due.some((group) => GROUPS_WITH_HEAD.includes(group));
  for (const group of due) {
    if (group !== "head" || !withHead) document.getElementById("run-draw-" + group)?.click();
  }
  seen.versions.status = versions.status;
  seen.at = now;
  return [];
}
""".replace("LIVE_REDRAW_MS", str(int(LIVE_REDRAW_SECONDS * 1000))).replace(
    "GROUP_TABS", json.dumps({group: tab for group, (tab, _) in GROUPS.items()})).replace(
    "GROUPS_WITH_HEAD", json.dumps([g for g, (_, names) in GROUPS.items() if g != "head" and HEAD[0] in names])
).replace("ACTIVE_STATUSES", json.dumps(list(UNFINISHED)))


def run_version(store: Store, run_id: int) -> dict[str, str]:
    """What a page on `run_id` could show, group by group (see `GROUPS`), as short strings from the shared snapshot:
    the page's poller compares them with the last ones and redraws only the groups that moved."""
    snap = live.snapshot(store, int(run_id))
    if snap is None:
        return {"status": "gone"}
    run, ids, value_set = snap["run"], snap["ids"], snap["value_set"]
    active = run["status"] in UNFINISHED
    # The run's own V* rows: their counts, and a revision that moves with any change of them.
    counts = sorted((run.get("value_counts") or {}).items())
    revision = run.get("values_revision")
    complete = bool(value_set and value_set["complete"])
    full = all(n >= values.PAGE_ROWS for _, n in counts) and bool(counts)
    parts = {
        "status": (run["status"],),
        "head": (run["status"], run.get("stage"), round(run.get("progress") or 0, 3), ids["evaluations"],
                 counts, complete, int(time.time() // 10) if active else 0),
        "controls": (run["status"], bool(run.get("error")), [split for split, n in counts if n]),
        "values": (counts, revision, complete, run.get("best_eval_accuracy"), (value_set or {}).get("summary")),
        "table": (counts, revision, complete),
        # A full first page only moves when the run's rows are rewritten (not when rows are added after it).
        "table_first": ("full", revision, complete) if full else (counts, revision, complete),
        "filtered": (counts, revision, complete),
        "training": (ids["metrics"], ids["evaluations"]),
        "samples": (ids["samples"],),
        "logs": (ids["logs"],),
    }
    return {group: "|".join(str(x) for x in part) for group, part in parts.items()}


def draw_group(services: Services, group: str, run_id: int | None, chart: ChartOptions, split: str, order: str,
               search: str | None, correct: str, text: str | None, step: str | None) -> list[Any]:
    """One group's outputs (see `GROUPS`) for the poller: no session state is read or written (the poller decided
    what moved); each value comes from what every session shares (`live.SHARED`)."""
    store = services.store
    snap = live.snapshot(store, run_id) if run_id is not None else None
    names = GROUPS[group][1]
    if snap is None:
        return [gr.skip()] * len(names)
    run = snap["run"]
    split, order, search = _inputs(split, order, search)
    versions = _versions(snap, chart, split, order, search, correct, text, step)
    out: dict[str, Any] = {}
    for view in GROUP_VIEWS[group]:
        out.update(_view(store, snap, versions, view, split, order, search, chart, correct, text, step,
                         services.scheduler))
    if group == "controls":
        out["split"] = gr.Dropdown(choices=_splits(run) or [split], value=split)
    if group == "idle":
        out["timer"] = gr.Timer(POLL_SECONDS, active=run["status"] in UNFINISHED)
    return [out.get(name, gr.skip()) for name in names]


def _inputs(split: str, order: str, search: str | None) -> tuple[str, str, str | None]:
    return split or "train", order if order in values.ORDERS else "stage-1 order", (search or "").strip() or None


def _versions(snap: dict[str, Any], chart: ChartOptions, split: str, order: str, search: str | None, correct: str,
              text: str | None, step: str | None) -> dict[str, Any]:
    """The current version of each view: what it would show, as ids and counts (compared with the shown ones)."""
    run, ids, value_set = snap["run"], snap["ids"], snap["value_set"]
    active = run["status"] in UNFINISHED
    vs_version = (run.get("value_set_id"), split, _count(run, split), run.get("values_revision"),
                  bool(value_set and value_set["complete"]), str((value_set or {}).get("summary")))
    return {
        # Header and progress: the elapsed time moves every 10 s while active.
        "header": (run["status"], run.get("stage"), round(run.get("progress") or 0, 3), run.get("error"),
                   ids["evaluations"], vs_version, int(time.time() // 10) if active else 0),
        "controls": (run["status"], run.get("error")),
        "summary": (vs_version, run.get("stage") == "values"),
        "charts": (vs_version, run.get("best_eval_accuracy")),
        # The first page in stage-1 order never changes once full: its rows are not sent again with each batch.
        "table_info": (vs_version, order, search),
        "table": (vs_version[:2], order, search, bool(value_set and value_set["complete"]),
                  ("full", run.get("values_revision"))
                  if order == "stage-1 order" and not search and _count(run, split) >= values.PAGE_ROWS
                  else (_count(run, split), run.get("values_revision"))),
        "filtered": vs_version,
        "training": (ids["metrics"], ids["evaluations"], chart, vs_version),
        "samples": (ids["samples"], training.sample_query(correct, text, step)),
        "logs": ids["logs"],
    }


def refresh(services: Services, run_id: int | None, state: dict[str, Any] | None, chart: ChartOptions, split: str,
            order: str, search: str | None, correct: str, text: str | None, step: str | None,
            tab: str | None = None) -> list[Any]:
    """Draw what moved since `state` (a tab switch, a filter change, a new run picked): updates for the
    `OUTPUTS`, where only the views on screen (the header and the selected tab) whose version moved since `state`
    are sent, everything else `gr.skip()`."""
    store = services.store
    if state is None or state.get("run_id") != run_id:
        state = new_state(run_id, (state or {}).get("tab", "values"))
    if tab is not None:
        state["tab"] = tab
    out: dict[str, Any] = {"state": state}
    snap = live.snapshot(store, run_id) if run_id is not None else None
    if snap is None:
        _set_timer(state, out, False)
        if state["shown"].get("empty"):
            return _updates(out)
        state["shown"] = {"empty": True}
        out.update(header="Pick a run above, launch one, or open one from the Runs page.", progress="",
                   error=gr.Textbox(visible=False, value=""), logs="", plot=_plot(charts.empty_spec("No run selected")),
                   evaluations=None, samples=None, samples_info="", picker=gr.Dropdown(choices=run_choices(store)),
                   **_values_view(store, {}, None, split or "train"), **_table_view(store, None, "", "", None),
                   **_filtered_view(store, None, ""), **dict(zip(("stop", "resume", "delete"), _button_updates(None),
                                                                 strict=True)))
        return _updates(out)

    split, order, search = _inputs(split, order, search)
    shown = state["shown"]
    versions = _versions(snap, chart, split, order, search, correct, text, step)
    for view in ("header", "controls", *TAB_VIEWS[state["tab"]]):
        if shown.get(view) == versions[view]:
            continue
        out.update(_view(store, snap, versions, view, split, order, search, chart, correct, text, step,
                         services.scheduler))
        if view == "summary" and shown.get("splits") != out["split"].choices:
            shown["splits"] = out["split"].choices  # a component update only when the splits changed
        elif view == "summary":
            del out["split"]
        shown[view] = versions[view]
    shown.pop("empty", None)
    _set_timer(state, out, snap["run"]["status"] in UNFINISHED, rearm=True)
    return _updates(out)


# The views behind each poller group of `GROUPS`.
GROUP_VIEWS = {"head": ("header",), "controls": ("controls",), "values": ("header", "summary", "charts", "table_info"),
               "table": ("table",), "filtered": ("header", "filtered"), "training": ("header", "training"),
               "samples": ("header", "samples"), "logs": ("header", "logs"), "idle": ("header",)}


def _view(store: Store, snap: dict[str, Any], versions: dict[str, Any], view: str, split: str, order: str,
          search: str | None, chart: ChartOptions, correct: str, text: str | None, step: str | None,
          jobs: Any = None) -> dict[str, Any]:
    """The outputs of one view of the run in `snap`, computed once per version for every session."""
    run, ids, value_set = snap["run"], snap["ids"], snap["value_set"]
    run_id = run["id"]
    if view == "header":
        return live.SHARED.get(("header", run_id, split), versions["header"],
                               lambda _prev: _header_view(store, run, value_set, split))
    if view == "controls":
        return _controls_view(store, run, jobs)
    if view in ("summary", "charts"):
        both = live.SHARED.get(("values", run_id, split), (versions["summary"], versions["charts"]),
                               lambda _prev: _values_view(store, run, value_set, split))
        keys = ("summary", "split") if view == "summary" else ("histogram", "correct_bar", "pass_rates")
        return {k: both[k] for k in keys}
    if view in ("table_info", "table"):
        return {view: _table_view(store, run, split, order, search)[view]}
    if view == "filtered":
        return _filtered_view(store, run, split)
    if view == "training":
        return _training_view(store, run_id, ids, chart, _eval_pass_rates(store, run, ids, value_set))
    if view == "samples":
        return _samples_view(store, run_id, ids["samples"], training.sample_query(correct, text, step))
    if view == "logs":
        return _logs_view(store, run_id, ids["logs"], jobs)
    raise ValueError(f"Unknown view {view!r}.")


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
        stop_btn = gr.Button("Stop", variant="stop", size="sm", scale=0, min_width=90, elem_id="run-stop")
        resume_btn = gr.Button("Resume", size="sm", scale=0, min_width=90, elem_id="run-resume")
        delete_btn = gr.Button("Delete", size="sm", scale=0, min_width=90, elem_id="run-delete")
        clone_btn = gr.Button("Clone into the Launch form", size="sm", scale=0, min_width=140, elem_id="run-clone")
    head = gr.Markdown("Pick a run above, launch one, or open one from the Runs page.", elem_id="run-header")
    progress = gr.HTML(elem_id="run-progress")
    error = gr.Textbox(label="Error", lines=8, max_lines=20, visible=False, interactive=False, elem_id="run-error")
    action_msg = gr.Markdown(elem_id="run-action")
    with gr.Tabs(selected="values", elem_id="run-tabs"):
        vtab = values.build_values_tabs()
        ttab = training.build_training_tab()
        stab = training.build_samples_tab()
        with gr.Tab("Logs", id="logs", elem_id="tab-logs") as logs_tab:
            logs = gr.Textbox(lines=18, max_lines=18, autoscroll=True, interactive=False, show_label=False,
                              elem_id="run-logs")
    state = gr.State(None)
    timer = gr.Timer(POLL_SECONDS, active=False)  # on while the picked run is active
    # Clicked by the poller (POLLER_JS), one per group of views.
    draw_buttons = {group: gr.Button(group, visible="hidden", elem_id=f"run-draw-{group}") for group in GROUPS}

    chart_inputs = ttab.controls()  # smoothing, x axis, log scale
    inputs = [picker, state, *chart_inputs, vtab.split, vtab.order, vtab.search, *stab.filters()]
    components = {"state": state, "timer": timer, "header": head, "progress": progress, "error": error,
                  **vtab.outputs(), "plot": ttab.plot, "evaluations": ttab.evaluations, "samples": stab.table,
                  "samples_info": stab.info, "logs": logs, "stop": stop_btn, "resume": resume_btn,
                  "delete": delete_btn, "picker": picker}
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

    def drawer(group: str):
        def handler(run_id, smoothing, x_axis, log_y, *rest):
            updates = draw_group(services, group, run_id, ChartOptions.of(smoothing, x_axis, log_y), *rest)
            # One output takes the value itself: a list of one would be read as a table of one row.
            return updates[0] if len(updates) == 1 else updates
        return handler

    def version(run_id: int) -> dict[str, str]:
        """The run's versions (see `run_version`): what the page's poller asks every few seconds."""
        return run_version(services.store, run_id)

    common = {"show_progress": "hidden", "concurrency_limit": None}
    private = {**common, "api_visibility": "private"}
    # The timer's event runs in the browser only: no Gradio event (each costs the page a walk over every component
    # of the app), just a request to `run_version`; a group is redrawn by a Gradio event when it moved. They are
    # callable by clients (scripts/polling_cost.py simulates a class with them); they read only what any viewer of
    # the page may see.
    timer.tick(None, None, None, js=POLLER_JS)
    gr.api(version, api_name="run_version", api_visibility="undocumented", concurrency_limit=None)
    draw_inputs = [picker, *chart_inputs, vtab.split, vtab.order, vtab.search, *stab.filters()]
    # A click while the group's last draw is still running (a busy server) draws once more after it: with Gradio's
    # default for buttons the click would be dropped, and the poller, which counts the change as drawn, would leave
    # the page showing the state before it.
    for group, button in draw_buttons.items():
        button.click(drawer(group), draw_inputs, [components[name] for name in GROUPS[group][1]],
                     api_name=f"run_draw_{group}", api_visibility="undocumented", trigger_mode="always_last",
                     **common)
    picker.change(reload, inputs, outputs, **private)
    picker.change(None, None, None, js=SHOW_RUN_TAB)  # a run picked here, launched or clicked on the Runs page
    for trigger in (vtab.split.change, vtab.order.change, vtab.search.submit, ttab.smoothing.release,
                    ttab.x_axis.change, ttab.log_y.change,
                    stab.correct.change, stab.text.submit, stab.step.submit):
        trigger(update, inputs, outputs, **private)
    for tab_id, tab in (("values", vtab.values_tab), ("filtered", vtab.filtered_tab), ("training", ttab.tab),
                        ("samples", stab.tab), ("logs", logs_tab)):
        tab.select(select(tab_id), inputs, outputs, **private)

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

    def act(action: str):
        def handler(run_id: int | None, token_value: str | None, request: gr.Request):
            if run_id is None:
                return "Pick a run first.", gr.skip(), gr.skip()
            user = services.auth.identify(token=token_value, request=request)
            try:
                services.act(action, run_id, user)  # the permission check of the API: own runs, or any as admin
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

    for button, action in ((stop_btn, "stop"), (resume_btn, "resume"), (delete_btn, "delete")):
        button.click(act(action), [picker, token], [action_msg, picker, timer], api_visibility="private")
    return RunPage(picker=picker, state=state, timer=timer, clone=clone_btn)
