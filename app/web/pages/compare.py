"""Compare page: curves of several runs overlaid, and the configuration keys on which they differ; for A*-PO and GRPO
runs (an "A*-PO vs GRPO" pair, or any picked), held-out accuracy against training time and against completion tokens,
A*-PO's time with and without its stage 1, peak memory, and a one-line verdict (`app.web.comparison`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr
import pandas as pd

from app.access.gate import Services
from app.web import charts, comparison
from app.web.common import run_choices

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


def build_compare_page(services: Services) -> gr.Dropdown:
    """Lay out the page; returns its run picker (its choices are refreshed when the page is opened)."""
    gr.Markdown("## Compare runs")
    with gr.Row():
        picker = gr.Dropdown(choices=run_choices(services.store), multiselect=True, label="Runs", scale=3,
                             elem_id="compare-runs")
        metrics = gr.Dropdown(choices=[m for m, _ in charts.TRAINING_METRICS], value=DEFAULT_METRICS,
                              multiselect=True, allow_custom_value=True, label="Metrics", scale=3,
                              elem_id="compare-metrics")
        smoothing = gr.Slider(0, 0.99, value=0.6, step=0.01, label="Smoothing", scale=1)
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100, elem_id="compare-refresh")
    gr.Markdown("### Held-out accuracy against cost", elem_id="compare-cost-title")
    verdict = gr.Markdown("Pick an A*-PO run and a GRPO run (the Launch page's \"A*-PO vs GRPO\" starts a matched "
                          "pair) for the verdict.", elem_id="compare-verdict")
    with gr.Row():
        by_time = gr.Plot(label="Accuracy against training time", elem_id="compare-time")
        by_tokens = gr.Plot(label="Accuracy against completion tokens", elem_id="compare-tokens")
    memory = gr.Plot(label="Peak memory", elem_id="compare-memory")
    gr.Markdown("Times are training time: from each run's first held-out evaluation (right before its first "
                "step), less the evaluations after it, so loading the model and measuring it are left out of both; "
                "A*-PO's stage 1 ran before it and is added to its solid curve (dotted: without it).",
                elem_id="compare-time-note")
    plot = gr.Plot(label="Overlaid curves", elem_id="compare-plot")
    diff = gr.Dataframe(interactive=False, label="Configuration differences", elem_id="compare-diff")

    def draw(run_ids: list[int] | None, names: list[str] | None, smooth: float):
        runs = [r for r in (services.store.get_run(i) for i in run_ids or []) if r is not None]
        if not runs:
            empty = charts.empty_figure("Pick runs to compare")
            return empty, None, empty, empty, empty, "Pick an A*-PO run and a GRPO run for the verdict."
        series = {f"#{r['id']} {r['name']}": charts.series_from_rows(services.store.get_metrics(r["id"]))
                  for r in runs}
        timelines = [comparison.store_timeline(services.store, r) for r in runs]
        pair = comparison.pick_pair(timelines)
        line = (comparison.verdict(*pair) if pair else
                "Pick an A*-PO run and a GRPO run among these for the verdict.")
        return (charts.compare_figure(series, names or DEFAULT_METRICS, smoothing=smooth), config_diff(runs),
                *charts.accuracy_figures(timelines), f"**Verdict:** {line}")

    outputs = [plot, diff, by_time, by_tokens, memory, verdict]
    for trigger in (picker.change, metrics.change, smoothing.release, refresh.click):
        trigger(draw, [picker, metrics, smoothing], outputs, api_visibility="private")
    return picker
