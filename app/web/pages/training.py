"""Training and Samples tabs of the run page: stage-2 curves, evaluations and the sampled completions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from app.web.common import short

# "#": a completion's index in its prompt's group (GRPO samples G per prompt and step; A*-PO one, #0).
SAMPLE_COLUMNS = ["step", "split", "question", "#", "completion", "reward", "V*", "advantage", "implicit reward",
                  "length"]
CORRECT_FILTERS = ["all", "correct", "incorrect"]
MAX_SAMPLES = 500


@dataclass
class TrainingTab:
    smoothing: gr.Slider
    x_axis: gr.Radio
    log_y: gr.Checkbox
    plot: gr.Plot
    evaluations: gr.Dataframe
    download: gr.Button
    data_file: gr.File
    tab: gr.Tab

    def controls(self) -> list[gr.components.Component]:
        """The inputs of the figure, in the order of `app.web.pages.run.ChartOptions`."""
        return [self.smoothing, self.x_axis, self.log_y]


@dataclass
class SamplesTab:
    correct: gr.Radio
    text: gr.Textbox
    step: gr.Textbox
    table: gr.Dataframe
    info: gr.Markdown
    tab: gr.Tab

    def filters(self) -> list[gr.components.Component]:
        return [self.correct, self.text, self.step]


def build_training_tab() -> TrainingTab:
    with gr.Tab("Training", id="training", elem_id="tab-training") as tab:
        with gr.Row():
            smoothing = gr.Slider(0, 0.99, value=0.6, step=0.01, scale=3,
                                  label="Smoothing (EMA); the raw line is drawn faint", elem_id="smoothing")
            x_axis = gr.Radio(["step", "time"], value="step", label="x axis", scale=1, elem_id="chart-x-axis")
            log_y = gr.Checkbox(False, label="log scale (y)", scale=1, elem_id="chart-log-y")
        plot = gr.Plot(label="Training curves", elem_id="training-plot")
        gr.Markdown("Eval accuracy is held-out greedy accuracy, measured before training (step 0), during and at "
                    "the end on the same prompts. The dashed lines are the reference policy's pass@1 and pass@N on "
                    "the prompts: pass@N is the share of prompts stage 1 can train on, not a limit on the trained "
                    "policy, which can learn to solve prompts no reference sample solved.", elem_id="eval-note")
        evaluations = gr.Dataframe(interactive=False, label="Evaluations", elem_id="evaluations-table",
                                   max_height=300)
        with gr.Row():
            download = gr.Button("Download the chart data (CSV)", size="sm", scale=0, min_width=240,
                                 elem_id="chart-download")
            data_file = gr.File(label="Chart data", visible=False, scale=2, elem_id="chart-data-file")
    return TrainingTab(smoothing, x_axis, log_y, plot, evaluations, download, data_file, tab)


def build_samples_tab() -> SamplesTab:
    with gr.Tab("Samples", id="samples", elem_id="tab-samples") as tab:
        with gr.Row():
            correct = gr.Radio(CORRECT_FILTERS, value="all", label="Reward", elem_id="samples-correct")
            text = gr.Textbox(label="Contains text", placeholder="search prompts and completions",
                              elem_id="samples-text")
            step = gr.Textbox(label="Step (empty: all)", placeholder="e.g. 10", elem_id="samples-step")
        info = gr.Markdown(elem_id="samples-info")
        table = gr.Dataframe(headers=SAMPLE_COLUMNS, interactive=False, wrap=True, max_height=600,
                             elem_id="samples-table", label="Stage-2 completions (newest first)",
                             column_widths=["6%", "6%", "25%", "4%", "24%", "7%", "7%", "8%", "8%", "5%"])
    return SamplesTab(correct, text, step, table, info, tab)


def sample_query(correct: str, text: str | None, step: str | None) -> dict[str, Any]:
    """Keyword arguments of `Store.get_samples` for the tab's filters (a step that is not a number is ignored)."""
    step = (step or "").strip()
    return {"correct": {"correct": True, "incorrect": False}.get(correct),
            "text": (text or "").strip() or None, "step": int(step) if step.lstrip("-").isdigit() else None}


def samples_frame(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """The Samples tab's table: `samples` in their order, a GRPO group's completions together, in index order."""
    def group(s: dict[str, Any]) -> tuple:
        return s["step"], s["split"], s.get("prompt_id")

    first: dict[tuple, int] = {}
    for i, s in enumerate(samples):
        first.setdefault(group(s), i)
    samples = sorted(samples, key=lambda s: (first[group(s)], s.get("sample_index") or 0))
    rows = [{"step": s["step"], "split": s["split"], "question": short(s["prompt_text"], 100),
             "#": s.get("sample_index") or 0, "completion": s["completion"], "reward": s["reward"],
             "V*": _round(s["v_star"]), "advantage": _round(s["advantage"]),
             "implicit reward": _round(s["implicit_reward"]), "length": s["completion_length"]} for s in samples]
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def evaluations_frame(evaluations: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"step": e["step"], "split": e["split"], **{k: _round(v) for k, v in (e.get("metrics") or {}).items()
                                                         if isinstance(v, (int, float)) or v is None}}
            for e in evaluations]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["step", "split"])


def _round(value: Any, digits: int = 4) -> Any:
    return round(value, digits) if isinstance(value, float) else value
