"""Compare page: curves of several runs overlaid, and the configuration keys on which they differ; for A*-PO and GRPO
runs (an "A*-PO vs GRPO" pair, or any picked), held-out accuracy against training time and against completion tokens,
A*-PO's time with and without its stage 1, peak memory, and a one-line verdict (`app.studies.comparison`); and two
runs' completions of one prompt side by side at matched steps (`app.web.pages.completions`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr
import pandas as pd

from app.access.gate import Services
from app.runtime.reward_versions import versions_note
from app.studies import comparison
from app.studies.protocols import PROTOCOL_LABELS, PROTOCOLS
from app.web import charts
from app.web.common import code_block, run_choices, run_label
from app.web.pages import completions

DEFAULT_METRICS = ["loss", "reward", "eval_accuracy", "log_ratio"]


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists are kept whole."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_diff(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per configuration key whose value is not the same in every run, one column per run."""
    flat = [{"model": r["model"], **flatten(r.get("config") or {})} for r in runs]
    keys = sorted({k for f in flat for k in f} - {"name"})
    columns = [f"#{r['id']} {r['name']}" for r in runs]
    rows = []
    for key in keys:
        cells = [f.get(key, "–") for f in flat]
        if len({repr(c) for c in cells}) > 1:
            rows.append({"setting": key, **{c: "" if v is None else str(v) for c, v in zip(columns, cells,
                                                                                          strict=True)}})
    return pd.DataFrame(rows, columns=["setting", *columns])


def study_members(store: Any) -> dict[str, list[dict[str, Any]]]:
    """Each study's runs, oldest first, newest study first: the runs carrying its label whose owner is the
    study's owner, the owner of its first run. The gate labels only the runs a user launches as one study, all
    at once; a row labelled otherwise (a label a spec sent, kept before the gate dropped it) is no run of that
    study, so one user's runs never move another user's medians or verdict."""
    studies: dict[str, list[dict[str, Any]]] = {}
    for run in store.list_runs():
        tag = (run.get("config") or {}).get("study")
        if isinstance(tag, dict) and tag.get("id"):
            studies.setdefault(str(tag["id"]), []).append(run)
    out = {}
    for sid, runs in studies.items():
        runs.sort(key=lambda r: r["id"])
        out[sid] = [r for r in runs if r.get("owner") == runs[0].get("owner")]
    return out


def study_choices(store: Any) -> list[tuple[str, str]]:
    """The studies among the stored runs (`app.studies`), newest first: ("name: A*-PO vs GRPO, paper protocol,
    3 seeds (6 runs)", study id), or ("name: sweep over beta2 x learning_rate, 2 seed(s) (18 runs)", id)."""
    studies = {sid: {**runs[0]["config"]["study"], "runs": len(runs)} for sid, runs in study_members(store).items()}
    out = []
    for sid, tag in studies.items():
        if tag.get("kind") == "pair":
            kind = "A*-PO vs GRPO, " + PROTOCOL_LABELS.get(str(tag.get("protocol")), str(tag.get("protocol")))
        elif tag.get("kind") == "sweep":
            kind = "sweep over " + (" x ".join(tag.get("grid") or {}) or "its seeds")
        else:
            kind = "seeds"
        out.append((f"{tag.get('name', sid)}: {kind}, {tag.get('seeds', 1)} seed(s) ({tag['runs']} runs)", sid))
    return out


def study_runs(store: Any, study_id: str) -> list[int]:
    """The ids of the study's runs (`study_members`)."""
    return [r["id"] for r in study_members(store).get(str(study_id), [])]


def build_compare_page(services: Services) -> gr.Dropdown:
    """Lay out the page; returns its run picker (its choices are refreshed when the page is opened)."""
    gr.Markdown("## Compare runs")
    with gr.Row():
        study = gr.Dropdown(choices=study_choices(services.store), value=None, label="Study (picks its runs)",
                            scale=1, elem_id="compare-study")  # half a row, as the runs: studies' names are long
        picker = gr.Dropdown(choices=run_choices(services.store), multiselect=True, label="Runs", scale=1,
                             elem_id="compare-runs")
    with gr.Row():
        metrics = gr.Dropdown(choices=[m for m, _ in charts.TRAINING_METRICS], value=DEFAULT_METRICS,
                              multiselect=True, allow_custom_value=True, label="Metrics", scale=3,
                              elem_id="compare-metrics")
        smoothing = gr.Slider(0, 0.99, value=0.6, step=0.01, label="Smoothing", scale=1)
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100, elem_id="compare-refresh")
    gr.Markdown("### Held-out accuracy against cost", elem_id="compare-cost-title")
    protocol = gr.Markdown("", elem_id="compare-protocol")
    verdict = gr.Markdown("Pick an A*-PO run and a GRPO run (the Launch page's \"A*-PO vs GRPO\" starts a matched "
                          "pair) for the verdict.", elem_id="compare-verdict")
    with gr.Row():
        by_time = gr.Plot(label="Accuracy against training time", elem_id="compare-time")
        by_tokens = gr.Plot(label="Accuracy against completion tokens", elem_id="compare-tokens")
    with gr.Row():
        by_steps = gr.Plot(label="Accuracy against optimizer steps", elem_id="compare-steps")
        by_compute = gr.Plot(label="Accuracy against compute", elem_id="compare-compute")
    memory = gr.Plot(label="Peak memory", elem_id="compare-memory")
    gr.Markdown("Times are each run's training time on its own clock (kept by the trainer and saved with its "
                "checkpoints): stage 1's sampling and scoring plus the training steps. Loading the model, queueing, "
                "evaluations, a pause between Stop and Resume and a chunk's restart are not in it. Compute is counted "
                "in FLOPs from the tokens each run processed (2 x parameters per token sampled or scored, 6 x per "
                "token trained): the same on any machine. A*-PO's stage 1 is added to its solid curve (dotted: "
                "without it). With several seeds, the bold curve is their median and the band their range.",
                elem_id="compare-time-note")
    seeds_table = gr.Dataframe(interactive=False, label="Each run's figures (medians over seeds where there are "
                               "several)", elem_id="compare-seeds", wrap=True)
    plot = gr.Plot(label="Overlaid curves", elem_id="compare-plot")
    diff = gr.Dataframe(interactive=False, label="Configuration differences", elem_id="compare-diff")

    def draw(run_ids: list[int] | None, names: list[str] | None, smooth: float):
        runs = [r for r in (services.store.get_run(i) for i in run_ids or []) if r is not None]
        if not runs:
            empty = charts.empty_figure("Pick runs to compare")
            return (empty, None, empty, empty, empty, empty, empty, None, "",
                    "Pick an A*-PO run and a GRPO run for the verdict.")
        series = {f"#{r['id']} {r['name']}": charts.series_from_rows(services.store.get_metrics(r["id"]))
                  for r in runs}
        view = comparison.study_view(runs, [comparison.store_timeline(services.store, r) for r in runs])
        pair = view.pair()
        line = (comparison.verdict(*pair) if pair else
                "Pick an A*-PO run and a GRPO run among these for the verdict.")
        difference = comparison.method_difference(services.store, runs) if pair else None
        if difference is not None:  # how sure: a paired bootstrap over the seeds and held-out prompts
            line = f"{difference.text()}\n\n{line}"
        line += versions_note(services.store, runs)  # runs scored by different versions of a reward's file
        figures = charts.accuracy_figures(view.timelines, list(view.medians.values()))
        stated = f"**Protocol:** {PROTOCOLS[view.protocol]}" if view.protocol in PROTOCOLS else ""
        table = pd.DataFrame(view.rows) if view.rows else None
        return (charts.compare_figure(series, names or DEFAULT_METRICS, smoothing=smooth), config_diff(runs),
                *figures, table, stated, f"**Verdict:** {line}")

    outputs = [plot, diff, by_time, by_tokens, memory, by_steps, by_compute, seeds_table, protocol, verdict]
    for trigger in (picker.change, metrics.change, smoothing.release, refresh.click):
        trigger(draw, [picker, metrics, smoothing], outputs, api_visibility="private")

    def pick_study(study_id: str | None):
        if not study_id:
            return gr.skip()
        return gr.update(choices=run_choices(services.store), value=study_runs(services.store, study_id))

    study.change(pick_study, study, picker, api_visibility="private")
    refresh.click(lambda: gr.update(choices=study_choices(services.store)), None, study, api_visibility="private")
    _build_side_by_side(services, picker)
    return picker


def _build_side_by_side(services: Services, picker: gr.Dropdown) -> None:
    """Two of the picked runs' completions of one prompt, each at its latest logged step at or before the step
    picked: A*-PO's one completion beside GRPO's G."""
    gr.Markdown("### One prompt, two runs", elem_id="compare-completions-title")
    with gr.Row():
        left = gr.Dropdown(label="Left run", scale=2, elem_id="compare-left")
        right = gr.Dropdown(label="Right run", scale=2, elem_id="compare-right")
        step = gr.Slider(0, 1, value=0, step=1, scale=3, elem_id="compare-step",
                         label="Step (each run shows its latest logged step at or before it)")
    prompt = gr.Dropdown(label="Prompt (those both runs sampled there first)", elem_id="compare-prompt")
    prompt_text = gr.Markdown(elem_id="compare-prompt-text")
    heads, tables = [], []
    with gr.Row(equal_height=False):
        for name in ("left", "right"):
            with gr.Column():
                heads.append(gr.Markdown(elem_id=f"compare-{name}-head"))
                tables.append(gr.Dataframe(headers=completions.SIDE_COLUMNS, interactive=False, wrap=True,
                                           max_height=500, column_widths=["36px", "45%"],
                                           elem_id=f"compare-{name}-table"))

    def draw(left_id: int | None, right_id: int | None, at: Any, prompt_id: str | None) -> list[Any]:
        shown = completions.side_by_side(services.store, [left_id, right_id], at, prompt_id)
        sides = shown["sides"] + [("", completions.side_frame([]))] * (2 - len(shown["sides"]))
        if shown["step"] is None:
            sides[0] = ("These runs logged no completions yet." if left_id or right_id else
                        "Pick runs above: two of them are set side by side here.", sides[0][1])
        text = code_block(shown["text"]) if shown["text"] else ""
        return [completions.step_slider(shown["steps"], shown["step"]),
                gr.Dropdown(choices=shown["choices"], value=shown["prompt"]), text,
                sides[0][0], sides[0][1], sides[1][0], sides[1][1]]

    drawn = [step, prompt, prompt_text, heads[0], tables[0], heads[1], tables[1]]

    picked = gr.State(None)  # the runs the pair below was last drawn for

    def pick_runs(run_ids: list[int] | None, before: list[int] | None):
        now = sorted(run_ids or [])
        if now == before:
            # The same runs: a change event that repeats the value (the picker's choices refreshed as the tab
            # opens can answer after the user picked) keeps the step and prompt the user set since.
            return [gr.skip()] * (3 + len(drawn))
        runs = [r for r in (services.store.get_run(i) for i in run_ids or []) if r is not None]
        choices = [(run_label(r), r["id"]) for r in runs]
        pair = completions.default_pair(runs)
        return [now, gr.Dropdown(choices=choices, value=pair[0]),
                gr.Dropdown(choices=choices, value=pair[1]), *draw(*pair, None, None)]

    private = {"api_visibility": "private", "show_progress": "hidden"}
    picker.change(pick_runs, [picker, picked], [picked, left, right, *drawn], **private)
    for trigger in (left.input, right.input):  # another run: its latest step
        trigger(lambda a, b, p: draw(a, b, None, p), [left, right, prompt], drawn, **private)
    step.release(draw, [left, right, step, prompt], drawn, **private)
    prompt.input(draw, [left, right, step, prompt], drawn, **private)
