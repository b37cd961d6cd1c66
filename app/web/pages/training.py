"""Training tab of the run page: stage-2 curves and evaluations (the Samples tab: `completions.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd


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
        """The inputs of the figure, in the order of `app.web.pages.run.frame.ChartOptions`."""
        return [self.smoothing, self.x_axis, self.log_y]


def build_training_tab() -> TrainingTab:
    with gr.Tab("Training", id="training", elem_id="tab-training") as tab:
        with gr.Row():
            smoothing = gr.Slider(0, 0.99, value=0.6, step=0.01, scale=3,
                                  label="Smoothing (EMA); the raw line is drawn faint", elem_id="smoothing")
            x_axis = gr.Radio(["step", "time", "compute"], value="step", label="x axis", scale=1,
                              elem_id="chart-x-axis", info="compute: FLOPs, stage 1 included (docs/compute.md)")
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


def evaluations_frame(evaluations: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"step": e["step"], "split": e["split"], **{k: _round(v) for k, v in (e.get("metrics") or {}).items()
                                                         if isinstance(v, (int, float)) or v is None}}
            for e in evaluations]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["step", "split"])


def _round(value: Any, digits: int = 4) -> Any:
    return round(value, digits) if isinstance(value, float) else value
