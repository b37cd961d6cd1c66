"""V* and Filtered tabs of the run page: what stage 1 found for each prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from app import charts
from app.ui.common import short

VALUE_COLUMNS = ["prompt_id", "prompt", "V*", "correct", "N", "filtered"]
FILTERED_COLUMNS = ["prompt_id", "prompt", "reason"]
COMPLETION_COLUMNS = ["#", "reward", "completion"]


@dataclass
class ValuesTab:
    summary: gr.Markdown
    split: gr.Dropdown
    histogram: gr.Plot
    correct_bar: gr.Plot
    pass_rates: gr.Plot
    table: gr.Dataframe
    prompt_text: gr.Markdown
    completions: gr.Dataframe
    filtered_summary: gr.Markdown
    filtered_table: gr.Dataframe

    def outputs(self) -> list[gr.components.Component]:
        """The components `render` fills, in its order."""
        return [self.summary, self.split, self.histogram, self.correct_bar, self.pass_rates, self.table,
                self.filtered_summary, self.filtered_table]


def num_samples(values: list[dict[str, Any]]) -> int:
    """N: the number of reference samples per prompt (the longest reward list)."""
    return max((len(v.get("rewards") or []) for v in values), default=0)


def filter_reason(row: dict[str, Any], n: int) -> str:
    if row.get("num_correct") is None:
        return "given V* is 0 (no reference samples)"
    return f"{row['num_correct']} of {n} reference samples correct"


def values_frame(values: list[dict[str, Any]]) -> pd.DataFrame:
    n = num_samples(values)
    rows = [{"prompt_id": v["prompt_id"], "prompt": short(v["prompt_text"], 160),
             "V*": None if v["v_star"] is None else round(v["v_star"], 4), "correct": v["num_correct"], "N": n,
             "filtered": bool(v["filtered"])} for v in values]
    return pd.DataFrame(rows, columns=VALUE_COLUMNS)


def filtered_frame(values: list[dict[str, Any]]) -> pd.DataFrame:
    n = num_samples(values)
    rows = [{"prompt_id": v["prompt_id"], "prompt": short(v["prompt_text"], 200), "reason": filter_reason(v, n)}
            for v in values if v["filtered"]]
    return pd.DataFrame(rows, columns=FILTERED_COLUMNS)


def completions_frame(row: dict[str, Any]) -> pd.DataFrame:
    rewards = row.get("rewards") or []
    completions = row.get("completions") or []
    return pd.DataFrame([{"#": i + 1, "reward": r, "completion": c}
                         for i, (r, c) in enumerate(zip(rewards, completions, strict=False))],
                        columns=COMPLETION_COLUMNS)


def ceilings(values: list[dict[str, Any]], summary: dict[str, Any] | None = None) -> dict[str, float]:
    """Reference pass@1 and pass@N: from the value set's summary when stored, else computed from the rows."""
    summary = summary or {}
    if summary.get("pass_at_1") is not None and summary.get("pass_at_n") is not None:
        return {"pass@1": float(summary["pass_at_1"]), "pass@N": float(summary["pass_at_n"])}
    counts = [v["num_correct"] for v in values if v.get("num_correct") is not None]
    return charts.reference_pass_rates(counts, num_samples(values))


def render(values: list[dict[str, Any]], splits: list[str], split: str, summary: dict[str, Any] | None,
           best_eval: float | None, progress_note: str = "") -> list[Any]:
    """Values for `ValuesTab.outputs()` from the stored prompt values of one split."""
    n = num_samples(values)
    counts = [v["num_correct"] for v in values if v.get("num_correct") is not None]
    filtered = sum(bool(v["filtered"]) for v in values)
    rates = ceilings(values, summary)
    if values:
        text = (f"**{len(values)} prompts** with V* ({split}){progress_note} · N = {n} reference samples each · "
                f"mean V* {pd.Series([v['v_star'] for v in values], dtype=float).mean():.3f} · "
                f"reference pass@1 {rates['pass@1']:.1%}, pass@{n} {rates['pass@N']:.1%} · "
                f"**{filtered} filtered**")
    else:
        text = "No V* estimates yet: stage 1 has not stored any prompt." + progress_note
    pass_fig = (charts.pass_rate_figure(rates["pass@1"], rates["pass@N"], n, best_eval) if values
                else charts.empty_figure("No pass rates yet", height=220))
    if filtered:
        ftext = (f"**{filtered} of {len(values)} prompts dropped** before stage 2: none of their {n} reference "
                 "samples was correct, so V* = 0 and the policy has nothing to regress toward.")
    else:
        ftext = "No prompt was filtered." if values else "No V* estimates yet."
    return [text, gr.Dropdown(choices=splits or [split], value=split),
            charts.value_histogram([v["v_star"] for v in values], [bool(v["filtered"]) for v in values]),
            charts.correct_count_bar(counts, n), pass_fig, values_frame(values), ftext, filtered_frame(values)]


def build_values_tabs() -> ValuesTab:
    """The V* tab and the Filtered tab (call inside a `gr.Tabs`)."""
    with gr.Tab("V*", id="values", elem_id="tab-values"):
        with gr.Row():
            summary = gr.Markdown(elem_id="values-summary")
            split = gr.Dropdown(choices=["train"], value="train", label="Split", scale=0, min_width=140,
                                elem_id="values-split")
        with gr.Row():
            histogram = gr.Plot(label="V* histogram", elem_id="vstar-histogram")
            correct_bar = gr.Plot(label="Correct samples out of N", elem_id="correct-bar")
        pass_rates = gr.Plot(label="Reference pass rates", elem_id="pass-rates")
        gr.Markdown("Click a prompt to see its N reference completions. Sort by clicking a column header; "
                    "filter with the search box.")
        table = gr.Dataframe(headers=VALUE_COLUMNS, interactive=False, show_search="filter", max_height=400,
                             elem_id="values-table", label="Prompts")
        prompt_text = gr.Markdown(elem_id="values-prompt")
        completions = gr.Dataframe(headers=COMPLETION_COLUMNS, interactive=False, wrap=True, max_height=400,
                                   elem_id="values-completions", label="Reference completions")
    with gr.Tab("Filtered", id="filtered", elem_id="tab-filtered"):
        filtered_summary = gr.Markdown(elem_id="filtered-summary")
        filtered_table = gr.Dataframe(headers=FILTERED_COLUMNS, interactive=False, show_search="search",
                                      wrap=True, max_height=500, elem_id="filtered-table", label="Filtered prompts")
    return ValuesTab(summary, split, histogram, correct_bar, pass_rates, table, prompt_text, completions,
                     filtered_summary, filtered_table)
