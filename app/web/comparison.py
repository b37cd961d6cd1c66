"""A*-PO against GRPO from stored rows: each run's held-out accuracy against training time and completion tokens, its
stage-1 cost, its peak memory, and the one-line verdict the Compare and Explain pages show.

Times are training seconds: since the run's first held-out evaluation (step 0, `eval_on_start`: both methods take
it right before their first training step), so model loading is left out of both, less the `eval_runtime` of every
later evaluation, so how often a run is measured does not count as its cost (an A*-PO evaluation also scores the
regression loss on held-out V*, and with few training steps its evaluations would be a large share of its wall time).
A*-PO's stage 1 ran before that point: its cost is the train split's `values/train/runtime` and
`values/train/completion_tokens` metrics, added to its curve "with stage 1" (a reused V* set logs about 0 s: it costs
nothing); the held-out split's V* is part of evaluating, left out as evaluations are. Pure functions of what `Store`
returns, no Gradio, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.web.common import format_duration

METHOD_LABELS = {"a2po": "A*-PO", "grpo": "GRPO"}
TOLERANCE = 1e-9  # accuracies are ratios of small counts: "reached" means >= up to float noise


@dataclass
class Point:
    step: int
    seconds: float  # training time: since the step-0 evaluation, less the evaluations in between
    tokens: int  # completion tokens sampled in training up to this step
    accuracy: float


@dataclass
class Timeline:
    """One run, as the comparison reads it."""

    run_id: int
    name: str
    method: str
    status: str
    points: list[Point] = field(default_factory=list)
    stage1_seconds: float = 0.0
    stage1_tokens: int = 0
    peak_memory_gb: float | None = None
    prompts: int | None = None  # A*-PO: the train prompts stage 1 scored, and of them those it kept
    prompts_kept: int | None = None
    zero_std_share: float | None = None  # GRPO: the mean share of groups whose G rewards were all equal

    @property
    def label(self) -> str:
        return f"#{self.run_id} {self.name} ({METHOD_LABELS.get(self.method, self.method)})"

    @property
    def final_accuracy(self) -> float | None:
        return self.points[-1].accuracy if self.points else None

    def first_reaching(self, accuracy: float) -> Point | None:
        return next((p for p in self.points if p.accuracy >= accuracy - TOLERANCE), None)


def run_method(run: Mapping[str, Any]) -> str:
    return (run.get("config") or {}).get("method") or "a2po"


def timeline(run: Mapping[str, Any], evaluations: Sequence[Mapping[str, Any]],
             metrics: Sequence[Mapping[str, Any]]) -> Timeline:
    """A run's timeline from its evaluations (`Store.get_evaluations`) and metric rows (`Store.get_metrics`)."""
    tokens_at: dict[int, int] = {}
    stage1_seconds: dict[str, float] = {}
    stage1_tokens: dict[str, int] = {}
    peak = None
    train_prompts = train_filtered = None
    zero_std: list[float] = []
    for row in metrics:
        name, value = row["name"], row["value"]
        if value is None:
            continue
        if name == "values/train/num_prompts":
            train_prompts = int(value)
        elif name == "values/train/num_filtered":
            train_filtered = int(value)
        elif name == "frac_reward_zero_std":
            zero_std.append(float(value))
        elif name == "completion_tokens":
            tokens_at[int(row["step"])] = int(value)
        elif name == "peak_memory_gb":
            peak = max(peak or 0.0, float(value))
        elif name == "values/train/runtime":
            stage1_seconds[name] = float(value)  # the latest: a resumed stage 1 logs its whole split
        elif name == "values/train/completion_tokens":
            stage1_tokens[name] = int(value)
    rows = [e for e in evaluations if e.get("split", "eval") == "eval"
            and isinstance((e.get("metrics") or {}).get("eval_accuracy"), (int, float))]
    points: list[Point] = []
    if rows:
        start = float(rows[0]["created_at"])
        steps = sorted(tokens_at)
        evaluating = 0.0  # seconds spent in the evaluations after the first, up to this one (each row is written
        for i, e in enumerate(rows):  # when its evaluation has ended)
            step = int(e["step"])
            runtime = e["metrics"].get("eval_runtime")
            if i and isinstance(runtime, (int, float)):
                evaluating += float(runtime)
            before = [s for s in steps if s <= step]
            points.append(Point(step, max(0.0, float(e["created_at"]) - start - evaluating),
                                tokens_at[before[-1]] if before else 0, float(e["metrics"]["eval_accuracy"])))
    kept = None if train_prompts is None else train_prompts - (train_filtered or 0)
    return Timeline(int(run["id"]), str(run.get("name") or ""), run_method(run), str(run.get("status") or ""),
                    points, sum(stage1_seconds.values()), sum(stage1_tokens.values()), peak, train_prompts, kept,
                    sum(zero_std) / len(zero_std) if zero_std else None)


def store_timeline(store: Any, run: Mapping[str, Any]) -> Timeline:
    """`timeline` of a stored run."""
    names = ["completion_tokens", "peak_memory_gb", "frac_reward_zero_std"]
    names += [n for n in store.metric_names(run["id"]) if n.startswith("values/")]
    return timeline(run, store.get_evaluations(run["id"]), store.get_metrics(run["id"], names=names))


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def verdict(a2po: Timeline, grpo: Timeline) -> str:
    """One line: the time A*-PO needed to reach GRPO's final held-out accuracy (with its stage 1 and without),
    and the time GRPO took to get there; says so when a run has not reached it or has not finished."""
    if not grpo.points or not a2po.points:
        missing = [t.label for t in (a2po, grpo) if not t.points]
        return f"No held-out accuracy yet for {' and '.join(missing)}: the verdict needs an eval set (eval_size > 0)."
    target = grpo.final_accuracy
    start = grpo.points[0].accuracy
    if target <= start and grpo.status == "finished":
        # Nothing was learned: "reached 0% in 0 s" would read as a result.
        return (f"GRPO's held-out accuracy did not rise ({percent(start)} at its start, {percent(target)} at its "
                f"end), so there is no accuracy of its to reach; A*-PO went from {percent(a2po.points[0].accuracy)} "
                f"to {percent(a2po.final_accuracy)}.")
    grpo_at = grpo.first_reaching(target)
    grpo_note = "" if grpo.status == "finished" else f" (GRPO is {grpo.status}: its latest accuracy is the target)"
    grpo_part = f"GRPO took {format_duration(grpo_at.seconds)}" + (
        f" (its run: {format_duration(grpo.points[-1].seconds)})" if grpo.points[-1].seconds > grpo_at.seconds
        else "")
    reached = a2po.first_reaching(target)
    if reached is None:
        best = max(a2po.points, key=lambda p: p.accuracy)
        still = "" if a2po.status == "finished" else f", and is still {a2po.status}"
        # The other way round, since A*-PO's run may well be the shorter one: when GRPO got to A*-PO's best.
        rival = grpo.first_reaching(best.accuracy) if best.accuracy > a2po.points[0].accuracy + TOLERANCE else None
        converse = "" if rival is None else (f" GRPO was at {percent(rival.accuracy)}, past A*-PO's best, by "
                                             f"{format_duration(rival.seconds)} (step {rival.step}).")
        return (f"A*-PO has not reached GRPO's final {percent(target)}{still}: its best is {percent(best.accuracy)} "
                f"at {format_duration(best.seconds + a2po.stage1_seconds)} ({format_duration(best.seconds)} without "
                f"stage 1); {grpo_part}.{grpo_note}{converse}")
    with_stage1 = reached.seconds + a2po.stage1_seconds
    return (f"A*-PO reached GRPO's final {percent(target)} in {format_duration(with_stage1)} "
            f"({format_duration(reached.seconds)} without its stage 1 of {format_duration(a2po.stage1_seconds)}); "
            f"{grpo_part}.{grpo_note}")


def pick_pair(timelines: Sequence[Timeline]) -> tuple[Timeline, Timeline] | None:
    """The first A*-PO run and the first GRPO run among those picked, or None without one of each."""
    a2po = next((t for t in timelines if t.method == "a2po"), None)
    grpo = next((t for t in timelines if t.method == "grpo"), None)
    return (a2po, grpo) if a2po is not None and grpo is not None else None


def cost_explanation(a2po: Timeline, grpo: Timeline, a2po_config: Mapping[str, Any],
                     grpo_config: Mapping[str, Any]) -> str:
    """Markdown: why the two cost what they cost, with the pair's own figures."""
    n = a2po_config.get("num_value_samples", "N")
    g = grpo_config.get("num_generations", "G")
    steps_a = a2po.points[-1].step if a2po.points else 0
    steps_g = grpo.points[-1].step if grpo.points else 0
    tokens_a = a2po.points[-1].tokens if a2po.points else 0
    tokens_g = grpo.points[-1].tokens if grpo.points else 0
    time_a = a2po.points[-1].seconds if a2po.points else 0.0
    time_g = grpo.points[-1].seconds if grpo.points else 0.0
    per_step = (f"{tokens_a / steps_a:,.0f} vs {tokens_g / steps_g:,.0f} completion tokens per step"
                if steps_a and steps_g else "")
    lines = [
        f"**Why the costs differ ({_markdown(a2po.label)} vs {_markdown(grpo.label)}).** At every step GRPO "
        f"samples G = {g} completions "
        f"of each prompt and compares them with each other (the advantage is a completion's reward against its "
        f"group's mean); A\\*-PO samples **one** completion per prompt per step, because its baseline V\\*(x) was "
        f"estimated once, before training, from N = {n} samples of the reference model (stage 1).",
        "",
        f"- Stage 1 (A\\*-PO only): {format_duration(a2po.stage1_seconds)}, {a2po.stage1_tokens:,} completion tokens"
        " (a V\\* set reused from an earlier run costs nothing).",
        f"- Training: A\\*-PO {steps_a} steps, {tokens_a:,} completion tokens, {format_duration(time_a)}; GRPO "
        f"{steps_g} steps, {tokens_g:,} completion tokens, {format_duration(time_g)}"
        + (f" ({per_step})." if per_step else "."),
        *_prompts_line(a2po, grpo),
        "- Peak memory: A\\*-PO " + (f"{a2po.peak_memory_gb:.2f} GB" if a2po.peak_memory_gb is not None else "–")
        + ", GRPO " + (f"{grpo.peak_memory_gb:.2f} GB" if grpo.peak_memory_gb is not None else "–")
        + " (each step's backward pass holds G× more sequences for GRPO).",
        "",
        verdict(a2po, grpo),
    ]
    return "\n".join(lines)


def _prompts_line(a2po: Timeline, grpo: Timeline) -> list[str]:
    """Why the step counts differ: the prompts each method trains on (a bullet, or none without the figures)."""
    if a2po.prompts is None or a2po.prompts_kept is None:
        return []
    dropped = a2po.prompts - a2po.prompts_kept
    line = (f"- Prompts trained on: A\\*-PO {a2po.prompts_kept} of {a2po.prompts}"
            + (f" (stage 1 dropped the {dropped} that none of its N reference samples solved)" if dropped else "")
            + "; GRPO every prompt of its dataset")
    if grpo.zero_std_share is not None:
        line += (f", though a group whose G rewards are all equal has zero advantage and teaches nothing: "
                 f"{100 * grpo.zero_std_share:.0f}% of its groups on average (`frac_reward_zero_std`)")
    return [line + "."]


def _markdown(text: str) -> str:
    """`text` shown as is in Markdown (a run's name or "A*-PO" would otherwise open emphasis)."""
    return re.sub(r"([\\`*_\[\]])", r"\\\1", text)
