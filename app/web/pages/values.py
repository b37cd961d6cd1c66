"""V* and Filtered tabs of the run page: what stage 1 found for each prompt.

A split can hold 100k prompts with N completions each, so nothing here reads a whole split: the summary, the
histogram and the correct-count bars come from `Store.value_stats` (aggregated in SQL), the tables show one page
(`PAGE_ROWS` prompts in the chosen order, searched in SQL), and a click loads that one prompt's completions.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from app.web import charts
from app.web.common import code_block, short

VALUE_COLUMNS = ["prompt_id", "question", "V*", "correct", "N", "filtered"]
FILTERED_COLUMNS = ["prompt_id", "question", "reason"]
COMPLETION_COLUMNS = ["#", "reward", "completion"]
PAGE_ROWS = 200
# Table orders: label -> (`Store.values_page` sort, descending).
ORDERS = {"stage-1 order": ("id", False), "V* (highest first)": ("v_star", True),
          "V* (lowest first)": ("v_star", False), "correct (most first)": ("num_correct", True),
          "correct (fewest first)": ("num_correct", False), "prompt id": ("prompt_id", False)}


@dataclass
class ValuesTab:
    summary: gr.Markdown
    split: gr.Dropdown
    histogram: gr.Plot
    correct_bar: gr.Plot
    pass_rates: gr.Plot
    order: gr.Dropdown
    search: gr.Textbox
    table_info: gr.Markdown
    table: gr.Dataframe
    prompt_text: gr.Markdown
    completions: gr.Dataframe
    filtered_summary: gr.Markdown
    filtered_table: gr.Dataframe
    values_tab: gr.Tab
    filtered_tab: gr.Tab

    def outputs(self) -> dict[str, gr.components.Component]:
        """The components `render` and `render_filtered` fill, by the names they use."""
        return {"summary": self.summary, "split": self.split, "histogram": self.histogram,
                "correct_bar": self.correct_bar, "pass_rates": self.pass_rates, "table_info": self.table_info,
                "table": self.table, "filtered_summary": self.filtered_summary,
                "filtered_table": self.filtered_table}


def filter_reason(row: dict[str, Any], n: int) -> str:
    if row.get("num_correct") is None:
        return "given V* is 0 (no reference samples)"
    return f"{row['num_correct']} of {n} reference samples correct"


def values_frame(rows: list[dict[str, Any]], n: int) -> pd.DataFrame:
    """Table rows from `Store.values_page` rows (no completions); `n` is N, the samples per prompt."""
    data = [{"prompt_id": v["prompt_id"], "question": short(v.get("question") or v["prompt_text"], 160),
             "V*": None if v["v_star"] is None else round(v["v_star"], 4), "correct": v["num_correct"], "N": n,
             "filtered": bool(v["filtered"])} for v in rows]
    return pd.DataFrame(data, columns=VALUE_COLUMNS)


def filtered_frame(rows: list[dict[str, Any]], n: int) -> pd.DataFrame:
    data = [{"prompt_id": v["prompt_id"], "question": short(v.get("question") or v["prompt_text"], 200),
             "reason": filter_reason(v, n)}
            for v in rows if v["filtered"]]
    return pd.DataFrame(data, columns=FILTERED_COLUMNS)


def completions_frame(row: dict[str, Any]) -> pd.DataFrame:
    rewards = row.get("rewards") or []
    completions = row.get("completions") or []
    return pd.DataFrame([{"#": i + 1, "reward": r, "completion": c}
                         for i, (r, c) in enumerate(zip(rewards, completions, strict=False))],
                        columns=COMPLETION_COLUMNS)


def prompt_detail(row: dict[str, Any] | None, prompt_id: str) -> tuple[str, Any]:
    """The text above a prompt's completions, and the completions table (one stored row, see `Store.get_value`)."""
    if row is None:
        return "Prompt not found.", None
    v_star = "–" if row["v_star"] is None else f"{row['v_star']:.4f}"
    text = (f"**Prompt {html.escape(prompt_id)}** · V* = {v_star} · {row['num_correct']} of "
            f"{len(row['rewards'])} correct{' · filtered' if row['filtered'] else ''}\n\n"
            f"The prompt as the model saw it (chat template applied):\n\n{code_block(row['prompt_text'], '')}")
    return text, completions_frame(row)


def ceilings(stats: dict[str, Any], summary: dict[str, Any] | None = None) -> dict[str, float]:
    """Reference pass@1 and pass@N: from the value set's summary when stored, else from the split's counts."""
    summary = summary or {}
    if summary.get("pass_at_1") is not None and summary.get("pass_at_n") is not None:
        return {"pass@1": float(summary["pass_at_1"]), "pass@N": float(summary["pass_at_n"])}
    if stats.get("pass_at_1") is None:
        return {}
    return {"pass@1": float(stats["pass_at_1"]), "pass@N": float(stats["pass_at_n"])}


def band_of(run: dict[str, Any] | None) -> list[float] | None:
    """The run's pass-rate band (`pass_rate_band` in its spec's config), or None when it trains on every prompt."""
    band = (((run or {}).get("config") or {}).get("config") or {}).get("pass_rate_band")
    return [float(band[0]), float(band[1])] if isinstance(band, (list, tuple)) and len(band) == 2 else None


def band_selection(stats: dict[str, Any], band: list[float]) -> dict[str, int]:
    """What a pass-rate band keeps of a split, from `Store.value_stats`' correct counts: `in_band` (prompts whose
    pass rate k / N lies in it), `kept` (those not also dropped by `filter_all_incorrect`, which only drops
    prompts at k = 0) and `sampled` (prompts with reference samples)."""
    counts, n = stats.get("correct") or [], stats.get("num_samples") or 0
    inside = [k for k in range(len(counts)) if n and band[0] - 1e-9 <= k / n <= band[1] + 1e-9]
    in_band = sum(counts[k] for k in inside)
    dropped_at_zero = min(stats.get("filtered") or 0, counts[0]) if 0 in inside else 0
    return {"in_band": in_band, "kept": in_band - dropped_at_zero, "sampled": sum(counts)}


def render(stats: dict[str, Any], splits: list[str], split: str, summary: dict[str, Any] | None,
           best_eval: float | None, progress_note: str = "", band: list[float] | None = None) -> dict[str, Any]:
    """The V* tab's summary, split picker and charts (figure specs, see `charts.to_json`; everything but the
    table) from `Store.value_stats`. With a pass-rate `band` (the run's `pass_rate_band`), the summary says what
    it kept and the correct-count chart becomes the histogram of pass rates with the band shaded."""
    n, count, filtered = stats["num_samples"], stats["count"], stats["filtered"]
    rates = ceilings(stats, summary)
    if count:
        mean = "–" if stats["mean_v_star"] is None else f"{stats['mean_v_star']:.3f}"
        rate_text = (f" · reference pass@1 {rates['pass@1']:.1%}, pass@{n} {rates['pass@N']:.1%}" if rates else "")
        text = (f"**{count:,} prompts** with V* ({split}){progress_note} · N = {n} reference samples each · "
                f"mean V* {mean}{rate_text} · **{filtered:,} filtered**")
        if band is not None and split == "train":
            chosen = band_selection(stats, band)
            text += (f" · pass-rate band [{band[0]:g}, {band[1]:g}]: **{chosen['kept']:,} of "
                     f"{chosen['sampled']:,} prompts kept** for training")
    else:
        text = "No V* estimates yet: stage 1 has not stored any prompt." + progress_note
    pass_fig = (charts.pass_rate_spec(rates["pass@1"], rates["pass@N"], n, best_eval) if count and rates
                else charts.empty_spec("No pass rates yet", height=220))
    hist = stats["histogram"]
    return {"summary": text, "split": gr.Dropdown(choices=splits or [split], value=split),
            "histogram": charts.binned_value_histogram_spec(hist["start"], hist["width"], hist["kept"],
                                                            hist["filtered"]),
            "correct_bar": (charts.pass_rate_band_spec(stats["correct"], band) if band is not None
                            else charts.counted_correct_bar_spec(stats["correct"])), "pass_rates": pass_fig}


def render_table(rows: list[dict[str, Any]], stats: dict[str, Any], order: str, search: str | None) -> dict[str, Any]:
    """The V* table (one page) and the line above it saying which page it is."""
    count = stats["count"]
    if search:
        info = (f"{len(rows)}{'+' if len(rows) >= PAGE_ROWS else ''} prompts contain “{search}”"
                f"{f' (the first {PAGE_ROWS} shown)' if len(rows) >= PAGE_ROWS else ''}, in {order}.")
    elif count > len(rows):
        info = f"The first {len(rows)} of {count:,} prompts, in {order}: search to find any of them."
    else:
        info = f"{count:,} prompts, in {order}." if count else ""
    return {"table_info": info, "table": values_frame(rows, stats["num_samples"])}


def render_filtered(rows: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """The Filtered tab from the first page of filtered prompts and the split's counts."""
    n, count, filtered = stats["num_samples"], stats["count"], stats["filtered"]
    if filtered:
        text = (f"**{filtered:,} of {count:,} prompts dropped** before stage 2: none of their {n} reference "
                "samples was correct, so V* = 0 and the policy has nothing to regress toward.")
        if filtered > len(rows):
            text += f" The first {len(rows)} are listed."
    else:
        text = "No prompt was filtered." if count else "No V* estimates yet."
    return {"filtered_summary": text, "filtered_table": filtered_frame(rows, n)}


def build_values_tabs() -> ValuesTab:
    """The V* tab and the Filtered tab (call inside a `gr.Tabs`)."""
    with gr.Tab("V*", id="values", elem_id="tab-values") as values_tab:
        with gr.Row():
            summary = gr.Markdown(elem_id="values-summary")
            split = gr.Dropdown(choices=["train"], value="train", label="Split", scale=0, min_width=140,
                                elem_id="values-split")
        with gr.Row():
            histogram = gr.Plot(label="V* histogram", elem_id="vstar-histogram")
            correct_bar = gr.Plot(label="Correct samples out of N", elem_id="correct-bar")
        pass_rates = gr.Plot(label="Reference pass rates", elem_id="pass-rates")
        gr.Markdown("Click a prompt to see its N reference completions. The table shows one page of the split: "
                    "pick its order, and search (prompt text or id) to find any prompt.")
        with gr.Row():
            order = gr.Dropdown(choices=list(ORDERS), value="stage-1 order", label="Order", scale=1,
                                elem_id="values-order")
            search = gr.Textbox(label="Search prompts", placeholder="text or id, then Enter", scale=3,
                                elem_id="values-search")
        table_info = gr.Markdown(elem_id="values-table-info")
        table = gr.Dataframe(headers=VALUE_COLUMNS, interactive=False, show_search="filter", max_height=400,
                             elem_id="values-table", label="Prompts")
        prompt_text = gr.Markdown(elem_id="values-prompt")
        completions = gr.Dataframe(headers=COMPLETION_COLUMNS, interactive=False, wrap=True, max_height=400,
                                   elem_id="values-completions", label="Reference completions")
    with gr.Tab("Filtered", id="filtered", elem_id="tab-filtered") as filtered_tab:
        filtered_summary = gr.Markdown(elem_id="filtered-summary")
        filtered_table = gr.Dataframe(headers=FILTERED_COLUMNS, interactive=False, show_search="search",
                                      wrap=True, max_height=500, elem_id="filtered-table", label="Filtered prompts")
    return ValuesTab(summary, split, histogram, correct_bar, pass_rates, order, search, table_info, table,
                     prompt_text, completions, filtered_summary, filtered_table, values_tab, filtered_tab)
