"""A*-PO against GRPO from stored rows: each run's held-out accuracy against training time and completion tokens, its
stage-1 cost, its peak memory, the median of several seeds, and the verdict the Compare and Explain pages show.

Times are the run's own clock (`a2po.callbacks.RunCounters`), which the trainer keeps and saves with every
checkpoint: `train_seconds`, the seconds spent in training steps, logged with every evaluation, and A*-PO's stage
1, `values/train/runtime` (its cumulative cost, earlier starts included). Loading the model, starting a process,
queueing, a pause between Stop and Resume, a chunk's restart and the evaluations themselves are in neither, so a
resumed or chunked run reads like an uninterrupted one. The held-out split's V* is part of evaluating, left out as
evaluations are. Rows stored before the clock existed fall back to the wall time between evaluations less their
`eval_runtime`. Pure functions of what `Store` returns: no Gradio, no torch.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from a2po.batches import spec_batch_figures
from a2po.compute import format_flops

METHOD_LABELS = {"a2po": "A*-PO", "grpo": "GRPO"}
TOLERANCE = 1e-9  # accuracies are ratios of small counts: "reached" means >= up to float noise
DEFAULT_EVAL_SIZE = 64  # a spec's dataset without eval_size holds out this many prompts (`a2po.runspec`)


def format_duration(seconds: float | None) -> str:
    """`1h 02m`, `3m 05s`, `42s`; an en dash when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "–"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds}s"


@dataclass
class Point:
    step: int
    seconds: float  # training time at this evaluation: the run's clock, stage 1 not included
    tokens: int  # completion tokens sampled in training up to this step
    accuracy: float
    spread: tuple[float, float] | None = None  # a median's lowest and highest accuracy over the seeds
    flops: float | None = None  # training compute at this evaluation (`a2po.compute`), stage 1 not included


@dataclass
class Timeline:
    """One run (or the median of a study's seeds), as the comparison reads it."""

    run_id: int
    name: str
    method: str
    status: str
    points: list[Point] = field(default_factory=list)
    stage1_seconds: float = 0.0
    stage1_tokens: int = 0
    stage1_flops: float = 0.0
    peak_memory_gb: float | None = None
    prompts: int | None = None  # A*-PO: the train prompts stage 1 scored, and of them those it kept
    prompts_kept: int | None = None
    zero_std_share: float | None = None  # GRPO: the mean share of groups whose G rewards were all equal
    has_eval: bool = True  # whether its spec holds prompts out for evaluation
    stage: str | None = None  # the stage a running run is in ("values": A*-PO's stage 1)
    eval_every: tuple[str, float] | None = None  # its spec's grid: ("steps", k), ("seconds", t), ("flops", c)
    seeds: int = 1  # a study's median: how many runs it is the median of
    label_text: str | None = None
    left_out: list[str] = field(default_factory=list)  # a study's median: its runs that had not finished ("#5 failed")
    stage1_reused_seconds: float = 0.0  # of stage 1's cost, the share charged for V* rows another run sampled
    stage1_reused_tokens: int = 0
    batch: str | None = None  # what one optimizer step trains on (`a2po.batches`), from its spec

    @property
    def label(self) -> str:
        if self.label_text:
            return self.label_text
        return f"#{self.run_id} {self.name} ({METHOD_LABELS.get(self.method, self.method)})"

    @property
    def final_accuracy(self) -> float | None:
        return self.points[-1].accuracy if self.points else None

    @property
    def seconds_with_stage1(self) -> float | None:
        return self.points[-1].seconds + self.stage1_seconds if self.points else None

    @property
    def flops_with_stage1(self) -> float | None:
        """The run's compute at its last evaluation, stage 1 included; None for rows stored before FLOPs were."""
        last = self.points[-1] if self.points else None
        return None if last is None or last.flops is None else last.flops + self.stage1_flops

    def first_reaching(self, accuracy: float) -> Point | None:
        return next((p for p in self.points if p.accuracy >= accuracy - TOLERANCE), None)

    def grid(self) -> tuple[str, float] | None:
        """How often it was evaluated: its spec's grid, else the commonest gap between its points (the last, which
        may be off the grid, left out)."""
        if self.eval_every:
            return self.eval_every
        steps = [p.step for p in self.points]
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        gaps = gaps[:-1] if len(gaps) > 1 else gaps
        return ("steps", float(statistics.mode(gaps))) if gaps else None


def run_method(run: Mapping[str, Any]) -> str:
    return (run.get("config") or {}).get("method") or "a2po"


def _eval_grid(spec: Mapping[str, Any]) -> tuple[str, float] | None:
    config = spec.get("config") or {}
    seconds, steps, flops = config.get("eval_every_seconds"), config.get("eval_steps"), config.get("eval_every_flops")
    if isinstance(flops, (int, float)) and flops > 0:
        return ("flops", float(flops))
    if isinstance(seconds, (int, float)) and seconds > 0:
        return ("seconds", float(seconds))
    if isinstance(steps, (int, float)) and steps >= 1:
        return ("steps", float(steps))
    return None  # a fraction of each run's own steps, or the end only: read from the points


def timeline(run: Mapping[str, Any], evaluations: Sequence[Mapping[str, Any]],
             metrics: Sequence[Mapping[str, Any]]) -> Timeline:
    """A run's timeline from its evaluations (`Store.get_evaluations`) and metric rows (`Store.get_metrics`)."""
    tokens_at: dict[int, int] = {}
    stage1_seconds = stage1_tokens = stage1_flops = reused_seconds = reused_tokens = 0.0
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
        elif name == "values/train/runtime":  # cumulative: the largest is the split's whole cost
            stage1_seconds = max(stage1_seconds, float(value))
        elif name == "values/train/completion_tokens":
            stage1_tokens = max(stage1_tokens, float(value))
        elif name == "values/train/flops":
            stage1_flops = max(stage1_flops, float(value))
        elif name == "values/train/reused_runtime":
            reused_seconds = max(reused_seconds, float(value))
        elif name == "values/train/reused_completion_tokens":
            reused_tokens = max(reused_tokens, float(value))
    rows = [e for e in evaluations if e.get("split", "eval") == "eval"
            and isinstance((e.get("metrics") or {}).get("eval_accuracy"), (int, float))]
    rows.sort(key=lambda e: (int(e["step"]), float(e.get("created_at") or 0.0)))
    rows = list({int(e["step"]): e for e in rows}.values())  # one point per step: the latest evaluation of it
    points: list[Point] = []
    steps = sorted(tokens_at)
    start = float(rows[0].get("created_at") or 0.0) if rows else 0.0
    evaluating = 0.0
    for i, e in enumerate(rows):
        step, m = int(e["step"]), e["metrics"]
        if isinstance(m.get("train_seconds"), (int, float)):
            seconds = float(m["train_seconds"])
        else:  # stored before the run's clock: wall time since the first evaluation, less the evaluations since
            runtime = m.get("eval_runtime")
            if i and isinstance(runtime, (int, float)):
                evaluating += float(runtime)
            seconds = max(0.0, float(e.get("created_at") or 0.0) - start - evaluating)
        if isinstance(m.get("completion_tokens"), (int, float)):
            tokens = int(m["completion_tokens"])
        else:
            before = [s for s in steps if s <= step]
            tokens = tokens_at[before[-1]] if before else 0
        flops = float(m["train_flops"]) if isinstance(m.get("train_flops"), (int, float)) else None
        points.append(Point(step, seconds, tokens, float(m["eval_accuracy"]), flops=flops))
    spec = run.get("config") or {}
    dataset = spec.get("dataset") or {}
    eval_size = dataset.get("eval_size", DEFAULT_EVAL_SIZE)
    kept = None if train_prompts is None else train_prompts - (train_filtered or 0)
    return Timeline(int(run["id"]), str(run.get("name") or ""), run_method(run), str(run.get("status") or ""),
                    points, stage1_seconds, int(stage1_tokens), stage1_flops, peak, train_prompts, kept,
                    sum(zero_std) / len(zero_std) if zero_std else None,
                    has_eval=bool(points) or not isinstance(eval_size, (int, float)) or eval_size > 0,
                    stage=run.get("stage"), eval_every=_eval_grid(spec), stage1_reused_seconds=reused_seconds,
                    stage1_reused_tokens=int(reused_tokens),
                    batch=figures.text() if (figures := spec_batch_figures(spec)) else None)


def store_timeline(store: Any, run: Mapping[str, Any]) -> Timeline:
    """`timeline` of a stored run."""
    names = ["completion_tokens", "peak_memory_gb", "frac_reward_zero_std"]
    names += [n for n in store.metric_names(run["id"]) if n.startswith("values/train/")]
    return timeline(run, store.get_evaluations(run["id"]), store.get_metrics(run["id"], names=names))


def finished(timelines: Sequence[Timeline]) -> list[Timeline]:
    """The runs a median is taken over: the finished ones with a held-out accuracy (a failed or unfinished run's
    latest point is not its end)."""
    return [t for t in timelines if t.status == "finished" and t.points]


def _at(t: Timeline, axis: str, x: float) -> Point:
    """`t` at `x` on `axis` ("step", "seconds" or "flops"): the accuracy of its latest evaluation at or before `x`
    (none is made up between two evaluations), its step, clock, tokens and compute interpolated towards the next
    one."""
    xs = [getattr(p, axis) for p in t.points]
    i = bisect.bisect_right(xs, x) - 1
    p, q = t.points[i], t.points[min(i + 1, len(xs) - 1)]
    share = (x - xs[i]) / (xs[i + 1] - xs[i]) if i + 1 < len(xs) and xs[i + 1] > xs[i] else 0.0
    flops = None if p.flops is None or q.flops is None else p.flops + share * (q.flops - p.flops)
    return Point(p.step + share * (q.step - p.step), p.seconds + share * (q.seconds - p.seconds),
                 p.tokens + share * (q.tokens - p.tokens), p.accuracy, flops=flops)


def _median_point(at: Sequence[Point]) -> Point:
    accuracy = [p.accuracy for p in at]
    flops = [p.flops for p in at if p.flops is not None]
    return Point(round(statistics.median(p.step for p in at)), statistics.median(p.seconds for p in at),
                 round(statistics.median(p.tokens for p in at)), statistics.median(accuracy),
                 (min(accuracy), max(accuracy)), statistics.median(flops) if len(flops) == len(at) else None)


def _one_per_grid_point(xs: Sequence[float], within: float) -> list[float]:
    """Sorted positions with each cluster of them (closer than `within` to its first) read as its latest: where
    every run has made that grid point's evaluation."""
    kept: list[float] = []
    first = None
    for x in xs:
        if kept and x - first < within:
            kept[-1] = x
        else:
            kept.append(x)
            first = x
    return kept


def median_timeline(timelines: Sequence[Timeline], label: str) -> Timeline | None:
    """The median of the finished runs among `timelines` (a study's seeds of one method), the others named in
    `left_out`; None while none has finished. Its curve aligns the runs by step, or by clock when they were evaluated
    on a time grid: at each position one of them was evaluated, from the latest position all have evaluated at to
    the shortest run's end, the median of each run's accuracy there (`_at`), with the lowest and highest. Runs on
    one clock or compute grid make each grid point's evaluation at their first step past it, a step apart from each
    other: those positions read as one, the latest (`_one_per_grid_point`), so the curve has a point per grid point
    rather than a stair of partial medians. Its last point is the median of each run's own last point (its end),
    whatever the number of evaluations before it. Its stage-1 cost is the runs' median, its peak memory the largest."""
    done = finished(timelines)
    if not done:
        return None
    grids = {(t.grid() or ("",))[0] for t in done}
    axis = grids.pop() if len(grids) == 1 and grids <= {"seconds", "flops"} else "step"
    start = max(getattr(t.points[0], axis) for t in done)
    end = min(getattr(t.points[-1], axis) for t in done)
    xs = sorted({getattr(p, axis) for t in done for p in t.points if start <= getattr(p, axis) < end})
    everies = {t.grid() for t in done}
    if axis != "step" and len(everies) == 1:
        xs = _one_per_grid_point(xs, everies.pop()[1] / 2)
    points = [_median_point([_at(t, axis, x) for t in done]) for x in xs]
    points.append(_median_point([t.points[-1] for t in done]))
    first = done[0]
    peaks = [t.peak_memory_gb for t in done if t.peak_memory_gb is not None]
    left_out = [f"#{t.run_id} " + (t.status if t.status != "finished" else "without held-out accuracy")
                for t in timelines if all(t is not d for d in done)]
    return Timeline(first.run_id, first.name, first.method, "finished", points,
                    statistics.median(t.stage1_seconds for t in done),
                    int(statistics.median(t.stage1_tokens for t in done)),
                    statistics.median(t.stage1_flops for t in done), max(peaks) if peaks else None,
                    first.prompts, first.prompts_kept, first.zero_std_share,
                    has_eval=all(t.has_eval for t in done), eval_every=first.eval_every, seeds=len(done),
                    label_text=label, left_out=left_out, batch=first.batch)


def seeds_text(t: Timeline) -> str:
    """How many runs a median is of: "3 of 3", or "2 of 3 (#5 failed left out)"."""
    left_out = f" ({', '.join(t.left_out)} left out)" if t.left_out else ""
    return f"{t.seeds} of {t.seeds + len(t.left_out)}{left_out}"


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def _no_point_yet(t: Timeline) -> str:
    """Why a run with a held-out set has no accuracy yet, by its status (the user did nothing wrong)."""
    name = escape_markdown(t.label)
    if t.status == "queued":
        return f"{name} is queued"
    if t.status in ("running", "stopping") and t.stage == "values":
        return f"{name} is in stage 1 (V\\*); its first held-out accuracy comes right before its first training step"
    if t.status in ("running", "stopping"):
        return f"{name} is starting; its first held-out accuracy comes right before its first training step"
    if t.status == "failed":
        return f"{name} failed before its first held-out evaluation (its Logs say why)"
    if t.status in ("stopped", "interrupted"):
        return f"{name} is {t.status} before its first held-out evaluation; resume it to go on"
    return f"{name} has no held-out evaluation"


def _state(t: Timeline, what: str) -> str:
    """ "" for a finished run, else what its latest point stands for."""
    if t.status == "finished":
        return ""
    state = "failed" if t.status == "failed" else f"is {t.status}"
    return f" ({what} {state}: its latest point, step {t.points[-1].step}, stands in for its end)"


def _coarser(t: Timeline, other: Timeline) -> bool:
    """Whether `t` was evaluated on a coarser grid than `other` (its times are then "at the latest")."""
    mine, theirs = t.grid(), other.grid()
    return bool(mine and theirs and mine[0] == theirs[0] and mine[1] > theirs[1] + TOLERANCE)


@dataclass(frozen=True)
class Cost:
    """What a verdict counts a run's cost in: its training time, or under equal compute its FLOPs (`a2po.compute`),
    the budget that pair shares; with or without stage 1, and how to write an amount of it."""

    name: str  # "seconds" or "flops"

    @classmethod
    def of(cls, *timelines: Timeline) -> Cost:
        """Compute where every run was evaluated on a grid of compute and counted it at each point, else time."""
        counted = all(t.grid() and t.grid()[0] == "flops" and all(p.flops is not None for p in t.points)
                      for t in timelines)
        return cls("flops" if counted else "seconds")

    @property
    def noun(self) -> str:
        return "compute" if self.name == "flops" else "time"

    def at(self, point: Point) -> float:
        return point.flops if self.name == "flops" else point.seconds

    def stage1(self, t: Timeline) -> float:
        return t.stage1_flops if self.name == "flops" else t.stage1_seconds

    def show(self, amount: float) -> str:
        return format_flops(amount) if self.name == "flops" else format_duration(amount)


def _when(t: Timeline, point: Point, amount: float, coarse: bool, extra: str = "", cost: Cost = Cost("seconds")
          ) -> str:
    index = t.points.index(point) if point in t.points else 0
    word = "by" if cost.name == "seconds" else "at"
    if coarse and index > 0:
        return f"{word} {cost.show(amount)} at the latest (step {point.step}{extra})"
    return f"{'in' if cost.name == 'seconds' else 'at'} {cost.show(amount)} (step {point.step}{extra})"


def _grids(a2po: Timeline, grpo: Timeline) -> str:
    def one(t: Timeline) -> str:
        grid = t.grid()
        if grid is None:
            return f"{len(t.points)} points"
        every = {"steps": f"every {grid[1]:g} steps", "flops": f"every {format_flops(grid[1])} of compute"}.get(
            grid[0], f"every {format_duration(grid[1])} of training")
        return f"{every}, {len(t.points)} points"
    if a2po.left_out or grpo.left_out:
        seeds = f" Medians of the finished seeds: A\\*-PO {seeds_text(a2po)}; GRPO {seeds_text(grpo)}."
    else:
        seeds = f" Medians of {a2po.seeds} seeds." if a2po.seeds > 1 or grpo.seeds > 1 else ""
    return f" Held-out evaluations: A\\*-PO {one(a2po)}; GRPO {one(grpo)}.{seeds}"


def verdict(a2po: Timeline, grpo: Timeline, margin: float = 0.0) -> str:
    """Markdown, one paragraph: the time A*-PO needed (with its stage 1 and without) to reach GRPO's final held-out
    accuracy less `margin` (under equal compute, the FLOPs: `Cost`), the time GRPO took to get there (with its stage 1
    where it selected prompts by pass rate), or why there is no answer yet; then what one optimizer step of each
    trained on (`a2po.batches`). Right for every status of either run: an unfinished run's latest point stands in for
    its end, and says so."""
    return _verdict(a2po, grpo, margin) + batch_note(a2po, grpo)


def batch_note(a2po: Timeline, grpo: Timeline) -> str:
    """" Per optimizer step: A*-PO ...; GRPO ...", or "" when a run's spec does not say."""
    if not a2po.batch or not grpo.batch:
        return ""
    return f" Per optimizer step: A\\*-PO {a2po.batch}; GRPO {grpo.batch}."


def _verdict(a2po: Timeline, grpo: Timeline, margin: float) -> str:
    missing = [t for t in (a2po, grpo) if not t.has_eval]
    if missing:
        names = " and ".join(escape_markdown(t.label) for t in missing)
        return (f"{names} {'holds' if len(missing) == 1 else 'hold'} no prompts out (eval_size 0), and the verdict "
                "compares held-out accuracy: launch with eval_size > 0.")
    waiting = [t for t in (a2po, grpo) if not t.points]
    if waiting:
        return "No held-out accuracy yet: " + "; ".join(_no_point_yet(t) for t in waiting) + "."
    grids = _grids(a2po, grpo)
    latest, start = grpo.final_accuracy, grpo.points[0].accuracy
    a2po_state, grpo_state = _state(a2po, "A\\*-PO"), _state(grpo, "GRPO")
    if max(p.accuracy for p in grpo.points) <= start + TOLERANCE:
        rose = "did not rise" if grpo.status == "finished" else "has not risen"
        return (f"GRPO's held-out accuracy {rose} above its start ({percent(start)}; {percent(latest)} at step "
                f"{grpo.points[-1].step}), so there is no accuracy of its to reach{grpo_state}. A\\*-PO went from "
                f"{percent(a2po.points[0].accuracy)} to {percent(a2po.final_accuracy)}{a2po_state}.{grids}")
    target = latest - margin
    what = f"GRPO's final {percent(latest)}" + (f" less {100 * margin:g} points ({percent(target)})" if margin else "")
    cost = Cost.of(a2po, grpo)
    grpo_at = grpo.first_reaching(target)
    grpo_cost = cost.at(grpo_at) + cost.stage1(grpo)  # GRPO has a stage 1 only to select prompts by pass rate
    grpo_whole = (f"; its whole run: {cost.show(cost.at(grpo.points[-1]) + cost.stage1(grpo))}"
                  if cost.at(grpo.points[-1]) > cost.at(grpo_at) else "")
    grpo_part = f"GRPO reached it {_when(grpo, grpo_at, grpo_cost, _coarser(grpo, a2po), grpo_whole, cost)}"
    if cost.stage1(grpo):
        grpo_part += f" with its stage 1 ({cost.show(cost.stage1(grpo))}, to select prompts)"
    reached = a2po.first_reaching(target)
    if reached is None:
        best = max(a2po.points, key=lambda p: p.accuracy)
        # The other way round, since A*-PO's run may well be the shorter one: when GRPO got to A*-PO's best.
        rival = grpo.first_reaching(best.accuracy) if best.accuracy > a2po.points[0].accuracy + TOLERANCE else None
        converse = "" if rival is None else (
            f" GRPO was at {percent(rival.accuracy)}, at or past A\\*-PO's best, "
            f"{_when(grpo, rival, cost.at(rival), _coarser(grpo, a2po), cost=cost)}.")
        return (f"A\\*-PO has not reached {what}{a2po_state}: its best is {percent(best.accuracy)} "
                f"{_when(a2po, best, cost.at(best) + cost.stage1(a2po), _coarser(a2po, grpo), cost=cost)} with its "
                f"stage 1 ({cost.show(cost.at(best))} without); {grpo_part}{grpo_state}.{converse}{grids}")
    with_stage1 = cost.at(reached) + cost.stage1(a2po)
    ratio = (f" A\\*-PO took {with_stage1 / grpo_cost:.2f}x GRPO's {cost.noun} with its stage 1."
             if grpo_cost > 0 else "")
    return (f"A\\*-PO reached {what} {_when(a2po, reached, with_stage1, _coarser(a2po, grpo), cost=cost)} with its "
            f"stage 1 ({cost.show(cost.at(reached))} without; stage 1: {cost.show(cost.stage1(a2po))})"
            f"{a2po_state}; {grpo_part}{grpo_state}.{ratio}{grids}")


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
        f"**Why the costs differ ({escape_markdown(a2po.label)} vs {escape_markdown(grpo.label)}).** At every step "
        f"GRPO samples G = {g} completions "
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


def escape_markdown(text: str) -> str:
    """`text` shown as is in Markdown (a run's name or "A*-PO" would otherwise open emphasis)."""
    return re.sub(r"([\\`*_\[\]])", r"\\\1", text)


@dataclass
class StudyView:
    """Several runs read together (a study's seeds, or any runs picked): each run's timeline, the median timeline
    of each method that has several, a table of each run's figures, and the protocol the runs were launched with."""

    timelines: list[Timeline]
    medians: dict[str, Timeline]
    rows: list[dict[str, Any]]
    protocol: str | None = None

    def pair(self) -> tuple[Timeline, Timeline] | None:
        """What the verdict compares: the methods' medians where there are several seeds, else the first of each
        that has not failed (a study none of whose seeds has finished yet)."""
        def first(method: str) -> Timeline | None:
            mine = [t for t in self.timelines if t.method == method]
            return next((t for t in mine if t.status != "failed"), mine[0] if mine else None)

        picked = [self.medians.get(m) or first(m) for m in ("a2po", "grpo")]
        return (picked[0], picked[1]) if all(picked) else None


def run_seed(run: Mapping[str, Any]) -> int | None:
    spec = run.get("config") or {}
    seed = (spec.get("study") or {}).get("seed", (spec.get("config") or {}).get("seed"))
    return int(seed) if isinstance(seed, (int, float)) else None


def _figures(t: Timeline) -> dict[str, Any]:
    last = t.points[-1] if t.points else None
    return {"final accuracy": percent(last.accuracy) if last else "–",
            "best accuracy": percent(max(p.accuracy for p in t.points)) if t.points else "–",
            "training time": format_duration(last.seconds + t.stage1_seconds) if last else "–",
            "without stage 1": format_duration(last.seconds) if last else "–",
            "training tokens": f"{last.tokens:,}" if last else "–",
            "stage-1 tokens": f"{t.stage1_tokens:,}" if t.method == "a2po" else "–",
            "peak memory GB": f"{t.peak_memory_gb:.2f}" if t.peak_memory_gb is not None else "–"}


def study_view(runs: Sequence[Mapping[str, Any]], timelines: Sequence[Timeline]) -> StudyView:
    """`StudyView` of `runs` and their timelines (in the same order): medians per method over its finished runs when
    it has several (`median_timeline`), and one table row per run (method, seed, status and figures) with a median row
    per such method."""
    rows, medians = [], {}
    for method in ("a2po", "grpo"):
        mine = [(r, t) for r, t in zip(runs, timelines, strict=True) if t.method == method]
        mine.sort(key=lambda rt: (run_seed(rt[0]) is None, run_seed(rt[0]) or 0, rt[1].run_id))
        for run, t in mine:
            seed = run_seed(run)
            rows.append({"method": METHOD_LABELS[method], "seed": "" if seed is None else str(seed),
                         "run": f"#{t.run_id} {t.name}", "status": t.status, **_figures(t)})
        median = median_timeline([t for _, t in mine], "") if len(mine) > 1 else None
        if median is not None:
            of = f" of {len(mine)}" if median.left_out else ""
            median.label_text = f"{METHOD_LABELS[method]} median of {median.seeds}{of}"
            medians[method] = median
            low, high = median.points[-1].spread
            row = {"method": METHOD_LABELS[method], "seed": "median", "run": f"seeds: {seeds_text(median)}",
                   "status": median.status, **_figures(median)}
            row["final accuracy"] += f" ({percent(low)}–{percent(high)})"
            rows.append(row)
    protocols = {((r.get("config") or {}).get("study") or {}).get("protocol") for r in runs}
    protocol = protocols.pop() if len(protocols) == 1 else None
    return StudyView(list(timelines), medians, rows, protocol)


# ----------------------------------------------------------------------------------------------------------------
# How sure a verdict is: a paired bootstrap over seeds and held-out prompts

BOOTSTRAP_RESAMPLES = 2000
TARGET_POINTS = 3.0  # the lead the studio aims for A*-PO to hold over GRPO's best (docs/benchmarks.md)


@dataclass
class PairedDifference:
    """One group of runs' final held-out accuracy minus another's, in points (A*-PO's minus GRPO's in a duel): the
    mean over the seeds both ran of each seed's difference on the held-out prompts both answered, and its 95% paired
    bootstrap interval (seeds and prompts resampled together, each prompt's two answers kept paired)."""

    points: float
    low: float
    high: float
    seeds: int
    prompts: int
    first: str = "A\\*-PO"
    second: str = "GRPO"

    @property
    def within_noise(self) -> bool:
        return self.low <= 0.0 <= self.high

    def text(self, target: float | None = TARGET_POINTS) -> str:
        """Markdown: the difference, its interval, whether it is within the noise, and (`target`) whether the first
        leads by that many points beyond it."""
        where = ("the interval holds 0: the difference is within the noise of these seeds and prompts"
                 if self.within_noise else f"{self.first if self.points > 0 else self.second} ahead beyond this noise")
        aim = "" if target is None else (
            f"; the aim ({self.first} ahead by {target:g} points or more) is "
            + ("met" if self.low >= target else "not ruled out" if self.high >= target else "missed"))
        return (f"**{self.first} − {self.second}: {self.points:+.1f} points** of final held-out accuracy (mean over "
                f"{self.seeds} seed pair(s) of {self.prompts} held-out prompts; 95% paired bootstrap interval "
                f"[{self.low:+.1f}, {self.high:+.1f}]): {where}{aim}.")


def final_answers(store: Any, run: Mapping[str, Any]) -> dict[str, float]:
    """A finished run's held-out answers at its last evaluation: {prompt id: 1.0 right, 0.0 wrong} (an unscored
    answer left out)."""
    rows = [e for e in store.get_evaluations(run["id"]) if e.get("split", "eval") == "eval"]
    if not rows:
        return {}
    step = max(int(e["step"]) for e in rows)
    return {s["prompt_id"]: float(s["reward"] >= 1.0 - TOLERANCE)
            for s in store.step_samples(run["id"], step, split="eval", limit=None) if s.get("reward") is not None}


def paired_difference(store: Any, first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]],
                      labels: tuple[str, str] = ("A\\*-PO", "GRPO"), resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = 0) -> PairedDifference | None:
    """`PairedDifference` of the finished runs `first` against `second`, paired by run seed, over the held-out
    prompts every pair answered; None without a finished pair."""
    import random

    def answers(runs: Sequence[Mapping[str, Any]]) -> dict[Any, dict[str, float]]:
        return {run_seed(r): final_answers(store, r) for r in runs if r.get("status") == "finished"}

    mine, theirs = answers(first), answers(second)
    pairs = [(mine[s], theirs[s]) for s in mine if s in theirs and mine[s] and theirs[s]]
    prompts = sorted(set.intersection(*(set(a) & set(b) for a, b in pairs))) if pairs else []
    if not prompts:
        return None
    diffs = [[a[p] - b[p] for p in prompts] for a, b in pairs]  # seed x prompt
    draw = random.Random(seed)
    estimates = []
    for _ in range(resamples):
        rows = [diffs[draw.randrange(len(diffs))] for _ in diffs]
        picked = [draw.randrange(len(prompts)) for _ in prompts]
        estimates.append(100 * statistics.fmean(row[i] for row in rows for i in picked))
    estimates.sort()
    return PairedDifference(100 * statistics.fmean(x for row in diffs for x in row),
                            estimates[int(0.025 * resamples)], estimates[int(0.975 * resamples) - 1], len(pairs),
                            len(prompts), *labels)


def method_difference(store: Any, runs: Sequence[Mapping[str, Any]]) -> PairedDifference | None:
    """A*-PO's runs against GRPO's among `runs` (a duel's seeds): `paired_difference`."""
    return paired_difference(store, [r for r in runs if run_method(r) == "a2po"],
                             [r for r in runs if run_method(r) == "grpo"])
