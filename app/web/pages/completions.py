"""The completions table: what the policy wrote at every logged step (the Run page's Samples tab: a step slider,
filters, sorts, one prompt across steps) and two runs' completions of one prompt side by side (Compare). The rows
come from the store's sample queries (`Store.sample_steps`, `step_samples`, `prompt_samples`); README's page table
describes the views."""

from __future__ import annotations

import bisect
import html
import math
from dataclasses import dataclass
from functools import reduce
from typing import Any

import gradio as gr
import pandas as pd

from app.web.common import code_block, method_label, short
from storage import Store

CORRECT_FILTERS = ["all", "correct", "incorrect"]
# The sort picker's choices: (the `Store.step_samples` sort, descending).
SORTS = {"prompt": ("prompt", False),
         "reward, highest first": ("reward", True), "reward, lowest first": ("reward", False),
         "advantage, highest first": ("advantage", True), "advantage, lowest first": ("advantage", False),
         "V*, highest first": ("v_star", True), "V*, lowest first": ("v_star", False)}
# "prompt": the prompt's id (a click on a row opens it across steps); "#": a completion's index in its prompt's
# group (GRPO samples G per prompt and step, A*-PO one, #0).
STEP_COLUMNS = ["step", "prompt", "question", "#", "completion", "reward", "advantage", "V*", "implicit reward",
                "length"]
HISTORY_COLUMNS = ["step", "#", "completion", "reward", "advantage", "V*", "implicit reward", "length"]
SIDE_COLUMNS = ["#", "completion", "reward", "advantage", "V*"]
# The tables' column widths: the two texts share the table's width; every other column keeps room for its heading's
# longest word and a few digits, and so does each extra column after them (a reward's value, a `log_extra` column).
# Left to the browser, a long text took the table and squeezed the reward columns to a letter per line.
COLUMN_WIDTHS = {"step": "56px", "prompt": "72px", "question": "15%", "#": "44px", "completion": "23%",
                 "reward": "72px", "advantage": "100px", "V*": "64px", "implicit reward": "88px", "length": "72px"}
EXTRA_WIDTH, MAX_EXTRA_COLUMNS = "88px", 20
# Rows at most in one step's table (a step holds a batch of prompts times G completions).
MAX_ROWS = 2000


@dataclass
class SamplesTab:
    split: gr.Radio
    step: gr.Slider
    latest: gr.Checkbox
    correct: gr.Radio
    text: gr.Textbox
    sort: gr.Dropdown
    info: gr.Markdown
    table: gr.Dataframe
    prompt: gr.Markdown
    history: gr.Dataframe
    tab: gr.Tab

    def filters(self) -> list[gr.components.Component]:
        """The tab's inputs, in the order of `app.web.pages.run.frame.Frame`'s sample fields."""
        return [self.correct, self.text, self.step, self.sort, self.latest, self.split]


def build_samples_tab() -> SamplesTab:
    with gr.Tab("Samples", id="samples", elem_id="tab-samples") as tab:
        with gr.Row():
            step = gr.Slider(0, 1, value=0, step=1, label="Step", scale=3, elem_id="samples-step",
                             info="the completions sampled at this step (a step without samples shows the one before)")
            latest = gr.Checkbox(True, label="follow the latest step", scale=1, elem_id="samples-latest")
            split = gr.Radio(["train"], value="train", label="Split", scale=1, elem_id="samples-split")
        with gr.Row():
            correct = gr.Radio(CORRECT_FILTERS, value="all", label="Reward", scale=1, min_width=330,
                               elem_id="samples-correct")
            text = gr.Textbox(label="Contains text", placeholder="search prompts and completions", scale=2,
                              elem_id="samples-text")
            sort = gr.Dropdown(list(SORTS), value="prompt", label="Sort by", scale=1, elem_id="samples-sort")
        info = gr.Markdown(elem_id="samples-info")
        table = gr.Dataframe(headers=STEP_COLUMNS, interactive=False, wrap=True, max_height=600,
                             column_widths=column_widths(STEP_COLUMNS), elem_id="samples-table",
                             label="Completions at the step (click a row: its prompt across steps)")
        prompt = gr.Markdown(elem_id="samples-prompt")
        history = gr.Dataframe(headers=HISTORY_COLUMNS, interactive=False, wrap=True, max_height=500,
                               column_widths=column_widths(HISTORY_COLUMNS, completion="38%"),
                               elem_id="samples-history", label="The prompt's completions across steps")
    return SamplesTab(split, step, latest, correct, text, sort, info, table, prompt, history, tab)


def column_widths(columns: list[str], **texts: str) -> list[str]:
    """`gr.Dataframe`'s `column_widths` for a table of `columns` and the extra columns that follow them; `texts`:
    a text column's own share (the history has no question column: its completion takes that room too)."""
    return [*({**COLUMN_WIDTHS, **texts}[column] for column in columns), *[EXTRA_WIDTH] * MAX_EXTRA_COLUMNS]


def sample_query(correct: str, text: str | None, sort: str | None) -> dict[str, Any]:
    """Keyword arguments of `Store.step_samples` for the tab's filters and sort (an unknown sort: by prompt)."""
    by, descending = SORTS.get(sort or "prompt", SORTS["prompt"])
    return {"correct": {"correct": True, "incorrect": False}.get(correct), "text": (text or "").strip() or None,
            "sort": by, "descending": descending}


def shown_step(steps: list[int], wanted: Any, latest: bool) -> int | None:
    """The logged step to show: the latest with `latest` (or nothing wanted), else the nearest at or below
    `wanted` (the first when `wanted` is before it); None when nothing was logged."""
    if not steps:
        return None
    try:
        wanted = None if latest or wanted in (None, "") else float(wanted)
    except (TypeError, ValueError):
        wanted = None
    if wanted is None:
        return steps[-1]
    return steps[max(0, bisect.bisect_right(steps, wanted) - 1)]


def step_slider(steps: list[int], step: int | None) -> gr.Slider:
    """The slider over the logged steps, at `step`: its stride is their common gap, so it stops on each of them
    when they are evenly spaced (a run logs samples every few steps)."""
    if not steps:
        return gr.Slider(minimum=0, maximum=1, step=1, value=0, interactive=False)
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    stride = reduce(math.gcd, gaps) if gaps else 1
    return gr.Slider(minimum=steps[0], maximum=max(steps[-1], steps[0] + 1), step=stride, value=step,
                     interactive=len(steps) > 1)


def extra_columns(samples: list[dict[str, Any]]) -> list[str]:
    """The keys of the samples' `extra` values (per-reward values and the reward functions' `log_extra`
    columns), in order of first appearance; none where the store keeps no such values."""
    return list(dict.fromkeys(key for s in samples for key in (s.get("extra") or {})))


def samples_frame(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """One step's table, `samples` in their order (by prompt: a GRPO group's completions together)."""
    extras = extra_columns(samples)
    rows = [{"step": s["step"], "prompt": s.get("prompt_id"), "question": short(s["prompt_text"], 100),
             **_scores(s), **_extra(s, extras)} for s in samples]
    return pd.DataFrame(rows, columns=[*STEP_COLUMNS, *extras])


def history_frame(samples: list[dict[str, Any]]) -> pd.DataFrame:
    """One prompt's completions across steps (`Store.prompt_samples`)."""
    extras = extra_columns(samples)
    rows = [{"step": s["step"], **_scores(s), **_extra(s, extras)} for s in samples]
    return pd.DataFrame(rows, columns=[*HISTORY_COLUMNS, *extras])


def prompt_heading(samples: list[dict[str, Any]], prompt_id: str) -> str:
    """The prompt's id, its text and the steps it was sampled at, above its table."""
    if not samples:
        return f"Prompt {_markdown_text(prompt_id)}: no completions logged."
    steps = sorted({s["step"] for s in samples})
    return (f"**Prompt {_markdown_text(prompt_id)}** · sampled at {len(steps)} step(s), "
            f"{steps[0]} to {steps[-1]} · {len(samples)} completions\n\n"
            f"{code_block(samples[0]['prompt_text'])}")


def _scores(s: dict[str, Any]) -> dict[str, Any]:
    return {"#": s.get("sample_index") or 0, "completion": s["completion"], "reward": _round(s["reward"]),
            "advantage": _round(s["advantage"]), "V*": _round(s["v_star"]),
            "implicit reward": _round(s["implicit_reward"]), "length": s["completion_length"]}


def _extra(s: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    extra = s.get("extra") or {}
    return {key: _round(extra.get(key)) for key in keys}


def _round(value: Any, digits: int = 4) -> Any:
    return round(value, digits) if isinstance(value, float) else value


# ------------------------------------------------------------------ two runs side by side (Compare)


def matched_steps(store: Store, run_ids: list[int], split: str = "train") -> list[int]:
    """Every step at which one of the runs logged samples, in order: the Compare slider's stops."""
    return sorted({step for run_id in run_ids for step in store.sample_steps(run_id, split)})


def prompt_choices(store: Store, run_ids: list[int], step: int, split: str = "train") -> list[tuple[str, str]]:
    """The prompts of the runs at their latest logged step at or below `step`, as (question, prompt id): those
    every run sampled there first, then the others."""
    seen: dict[str, tuple[str, int]] = {}
    for run_id in run_ids:
        steps = [s for s in store.sample_steps(run_id, split) if s <= step]
        if not steps:
            continue
        for row in store.step_samples(run_id, steps[-1], split, limit=MAX_ROWS):
            text, runs = seen.get(row["prompt_id"], (row["prompt_text"], 0))
            seen[row["prompt_id"]] = (text, runs | 1 << run_ids.index(run_id))
    everyone = (1 << len(run_ids)) - 1
    ordered = sorted(seen.items(), key=lambda item: item[1][1] != everyone)
    return [(f"{short(text, 90)} [{prompt_id}]", prompt_id) for prompt_id, (text, _) in ordered]


def side(store: Store, run: dict[str, Any], prompt_id: str, step: int, split: str = "train"
         ) -> tuple[str, pd.DataFrame]:
    """One run's completions of the prompt at its latest step at or below `step`: a heading and the table."""
    rows = store.prompt_samples(run["id"], prompt_id, split, at_or_below=step)
    name = _markdown_text(f"#{run['id']} {run['name']} ({method_label(run)})")
    if not rows:
        later = store.prompt_samples(run["id"], prompt_id, split)
        when = f"; first at step {later[0]['step']}" if later else ""
        return f"**{name}**: no completion of this prompt at or before step {step}{when}.", side_frame([])
    at = rows[0]["step"]
    where = f"step {at}" if at == step else f"step {at} (its latest at or before {step})"
    count = f"{len(rows)} completion{'s' if len(rows) != 1 else ''}"
    return f"**{name}** · {where} · {count}", side_frame(rows)


def _markdown_text(text: str) -> str:
    """`text` shown as it is in Markdown: HTML and Markdown's marks escaped ("A*-PO" is no emphasis)."""
    return "".join(f"\\{c}" if c in "\\`*_[]#" else c for c in html.escape(text, quote=False))


def side_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One side's table: each completion of the prompt at the run's step and its scores (two fit side by side)."""
    return pd.DataFrame([{k: v for k, v in _scores(s).items() if k in SIDE_COLUMNS} for s in rows],
                        columns=SIDE_COLUMNS)


def default_pair(runs: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """The two runs to set side by side among `runs`: the first A*-PO run and the first GRPO run when both are
    there (a pair's two sides), else the first two."""
    by_method: dict[str, int] = {}
    for run in runs:
        by_method.setdefault(method_label(run), run["id"])
    if len(by_method) >= 2 and "A*-PO" in by_method:
        other = next(run_id for method, run_id in by_method.items() if method != "A*-PO")
        return by_method["A*-PO"], other
    ids = [run["id"] for run in runs] + [None, None]
    return ids[0], ids[1]


def side_by_side(store: Store, run_ids: list[int | None], step: Any, prompt_id: str | None,
                 split: str = "train") -> dict[str, Any]:
    """What Compare shows of the runs' completions: `steps` (every step one of them logged), the `step` shown (the
    nearest logged at or below the one asked for; the latest when none is), the prompt `choices` at it, the
    `prompt` shown (the one asked for while it is among them, else the first), its `text`, and per run a heading
    and its completions of the prompt at the run's latest logged step at or below `step` (`sides`)."""
    runs = [run for run in (store.get_run(int(i)) for i in run_ids if i is not None) if run is not None]
    ids = [run["id"] for run in runs]
    steps = matched_steps(store, ids, split)
    shown = shown_step(steps, step, latest=step in (None, ""))
    choices = prompt_choices(store, ids, shown, split) if shown is not None else []
    known = [value for _, value in choices]
    prompt = prompt_id if prompt_id in known else (known[0] if known else None)
    sides = [side(store, run, prompt, shown, split) for run in runs] if prompt is not None else []
    text = next((row["prompt_text"] for run in runs
                 for row in store.prompt_samples(run["id"], prompt, split, at_or_below=shown)[:1]),
                "") if prompt is not None else ""
    return {"steps": steps, "step": shown, "choices": choices, "prompt": prompt, "text": text, "sides": sides}
