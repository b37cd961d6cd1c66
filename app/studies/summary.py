"""A sweep read back: one row per grid point (medians over its seeds), the best point, a heatmap of two-field grids,
and what sharing stage 1 saved. The Studies page (`app.web.pages.studies`) draws it; `summarize` needs only the runs
and their timelines (`comparison.store_timeline`), so it is tested without a studio.

Per grid point (the runs of one method at one point, a run per seed; the medians are over those that finished, a
failed or unfinished run's latest point not being its end):
    final accuracy   the median over seeds of each run's last held-out accuracy, and its lowest and highest
    best accuracy    the median over seeds of each run's best held-out accuracy, and the median step it came at
    curve            the median curve (`comparison.median_timeline`: aligned by step, clock or compute, never by index)
    training time    the median of each run's clock: stage 1 (where the run sampled it) plus its training steps
    tokens           the median completion tokens sampled, stage 1 included where the run sampled it
    compute          the median of each run's compute in FLOPs (`a2po.compute`), stage 1 or its charge included
The best point has the highest median final accuracy among the points whose runs all finished (ties: the one
that got there in less training time).

A halving sweep (`app.studies.sweeps`) reads each point at the highest rung it reached: a point left out of the next
rung is "pruned" there (never "failed": it ran as asked), and only points of the last rung can be the best.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from a2po.compute import format_flops
from a2po.sweep import point_label, show_value
from app.studies.comparison import METHOD_LABELS, Timeline, finished, format_duration, median_timeline, run_seed


def percent(value: float) -> str:
    """One decimal: with 128 held-out prompts one prompt moves accuracy by 0.8 points."""
    return f"{100 * value:.1f}%"


@dataclass
class PointRow:
    """One grid point of one method: its runs (one per seed) and their medians."""

    point: dict[str, Any]
    method: str
    run_ids: list[int]
    statuses: list[str]
    final: float | None = None
    final_range: tuple[float, float] | None = None
    best: float | None = None
    best_step: float | None = None
    training_seconds: float | None = None
    tokens: float | None = None
    flops: float | None = None
    curve: Timeline | None = None  # the median over seeds, for the curves figure
    rung: int | None = None  # a halving sweep: the highest rung the point reached (of `rungs`)
    rungs: int | None = None
    pruned: bool = False  # a halving sweep: the point was left out of the rung after `rung`

    @property
    def label(self) -> str:
        return point_label(self.point)

    @property
    def finished(self) -> bool:
        """Every run of the point finished (in a halving sweep: at its last rung)."""
        last = self.rung is None or self.rung == (self.rungs or 0) - 1
        return last and all(s == "finished" for s in self.statuses)

    @property
    def state(self) -> str:
        """Where a halving sweep's point stands: "pruned at rung 1 of 3", "rung 2 of 3" (under way), "finished all 3
        rungs"; "" for any other sweep."""
        if self.rung is None:
            return ""
        ended = next((s for s in self.statuses if s in ("failed", "stopped", "interrupted")), None)
        where = f"rung {self.rung} of {self.rungs}"
        if self.pruned:
            return f"pruned at {where}"
        if ended:
            return f"{ended} at {where}"
        return f"finished all {self.rungs} rungs" if self.finished else where

    def table_row(self, best: bool, by_field: bool = False) -> dict[str, Any]:
        """The point's row: its settings as one "grid point" column, or with `by_field` a column per field holding
        the value alone (a grid whose points share their fields: a row then fits the page)."""
        done = sum(s == "finished" for s in self.statuses)
        spread = ("" if self.final_range is None or done < 2  # one seed has no range
                  else f" ({percent(self.final_range[0])}–{percent(self.final_range[1])})")
        settings = ({f: show_value(v) for f, v in self.point.items()} if by_field and self.point
                    else {"grid point": self.label})
        row = {"": "★" if best else "", **settings, "method": METHOD_LABELS.get(self.method, self.method)}
        if self.rung is not None:
            row["halving"] = self.state
        return {**row, "seeds finished": f"{done} of {len(self.statuses)}",
                "final accuracy (median, range)": "–" if self.final is None else percent(self.final) + spread,
                "best accuracy (step)": "–" if self.best is None else f"{percent(self.best)} ({self.best_step:g})",
                "training time": format_duration(self.training_seconds),
                "compute": format_flops(self.flops),
                "tokens": "–" if self.tokens is None else f"{self.tokens:,.0f}",
                "runs": ", ".join(f"#{i}" for i in self.run_ids)}


@dataclass
class Heatmap:
    """Median final accuracy over a two-field grid (of one method): z[i][j] at y_values[i], x_values[j]."""

    x_field: str
    y_field: str
    x_values: list[Any]
    y_values: list[Any]
    z: list[list[float | None]]
    method: str


@dataclass
class StudySummary:
    rows: list[PointRow]
    best: PointRow | None
    grid: dict[str, list[Any]]
    seeds: int
    heatmap: Heatmap | None = None
    stage_one: dict[str, float] = field(default_factory=dict)
    best_by_method: dict[str, PointRow] = field(default_factory=dict)  # with both methods: each one's own best

    def table(self) -> list[dict[str, Any]]:
        by_field = len({tuple(row.point) for row in self.rows}) == 1
        return [row.table_row(row is self.best, by_field) for row in self.rows]

    @property
    def runner_up(self) -> PointRow | None:
        """The best point's closest rival: the next of its method among the points whose runs all finished."""
        if self.best is None:
            return None
        rivals = [r for r in self.rows if r is not self.best and r.method == self.best.method and r.finished
                  and r.final is not None]
        return _best(rivals)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _point_of(run: Mapping[str, Any]) -> dict[str, Any]:
    study = (run.get("config") or {}).get("study") or {}
    return dict(study.get("point") or {})


def summarize(runs: Sequence[Mapping[str, Any]], timelines: Sequence[Timeline]) -> StudySummary:
    """The study's rows in grid order (the order its runs were made), its best point and heatmap, and stage 1's
    savings (`stage_one_savings`)."""
    groups: dict[tuple[str, str], list[tuple[Mapping[str, Any], Timeline]]] = {}
    for run, line in zip(runs, timelines, strict=True):
        point = _point_of(run)
        groups.setdefault((repr(sorted(point.items())), line.method), []).append((run, line))
    top_rung = max((_rung_of(run)[0] for run in runs), default=-1)
    rows = []
    for members in groups.values():
        rung, rungs = max(_rung_of(run) for run, _ in members)
        members = [(run, line) for run, line in members if _rung_of(run)[0] == rung]  # its highest rung's runs
        members.sort(key=lambda rt: (run_seed(rt[0]) or 0, rt[1].run_id))
        lines = [t for _, t in members]
        done = finished(lines)
        finals = [t.final_accuracy for t in done]
        bests = [max(t.points, key=lambda p: (p.accuracy, -p.step)) for t in done]
        row = PointRow(_point_of(members[0][0]), lines[0].method, [t.run_id for t in lines],
                       [t.status for t in lines])
        if rungs is not None:
            # Left out of the next rung having run as asked: pruned. (A failed run is left out too, and says so.)
            row.rung, row.rungs = rung, rungs
            row.pruned = rung < top_rung and all(t.status == "finished" for t in lines)
        if done:
            row.final = _median(finals)
            row.final_range = (min(finals), max(finals))
            row.best = _median([p.accuracy for p in bests])
            row.best_step = _median([p.step for p in bests])
            row.training_seconds = _median([t.seconds_with_stage1 for t in done])
            row.tokens = _median([t.points[-1].tokens + t.stage1_tokens for t in done])
            row.flops = _median([t.flops_with_stage1 for t in done])
            row.curve = median_timeline(lines, f"{row.label} ({METHOD_LABELS.get(row.method, row.method)})")
        rows.append(row)
    candidates = [r for r in rows if r.finished and r.final is not None]
    best = _best(candidates)
    by_method = {m: _best([r for r in candidates if r.method == m]) for m in sorted({r.method for r in candidates})}
    tag = ((runs[0].get("config") or {}).get("study") or {}) if runs else {}
    grid = dict(tag.get("grid") or {})
    return StudySummary(rows, best, grid, int(tag.get("seeds") or 1), heatmap(rows, grid),
                        stage_one_savings(runs, timelines), by_method if len(by_method) > 1 else {})


def _rung_of(run: Mapping[str, Any]) -> tuple[int, int | None]:
    """(its rung, the sweep's rungs) for a run of a halving sweep, else (0, None)."""
    tag = (run.get("config") or {}).get("study") or {}
    halving = tag.get("halving")
    return (int(tag.get("rung") or 0), int(halving.get("rungs") or 0)) if isinstance(halving, dict) else (0, None)


def _best(rows: Sequence[PointRow]) -> PointRow | None:
    """The highest median final accuracy; among equals, the least training time."""
    return max(rows, key=lambda r: (r.final, -(r.training_seconds or 0.0)), default=None)


def heatmap(rows: Sequence[PointRow], grid: Mapping[str, list[Any]]) -> Heatmap | None:
    """Median final accuracy over the grid's two fields (besides `method`), for the method with the most points;
    None unless the grid has exactly two such fields."""
    fields = [f for f in grid if f != "method"]
    if len(fields) != 2 or not rows:
        return None
    methods = [r.method for r in rows]
    method = max(set(methods), key=methods.count)
    y_field, x_field = fields
    cells = {(repr(r.point.get(y_field)), repr(r.point.get(x_field))): r.final for r in rows if r.method == method}
    x_values, y_values = list(grid[x_field]), list(grid[y_field])
    z = [[cells.get((repr(y), repr(x))) for x in x_values] for y in y_values]
    return Heatmap(x_field, y_field, x_values, y_values, z, method)


def stage_one_savings(runs: Sequence[Mapping[str, Any]], timelines: Sequence[Timeline]) -> dict[str, float]:
    """What one stage 1 per V* set saved: A*-PO runs grouped by their V* set (`value_set_id`); in each, the runs that
    sampled (stage-1 tokens beyond their charge for reused rows) paid for it, and every other run of the set saved
    what it was charged (or, stored before charges, as much as the samplers paid).
    {"a2po_runs", "value_sets", "sampled_runs", "saved_tokens", "saved_seconds"}."""
    sets: dict[Any, list[Timeline]] = {}
    for run, line in zip(runs, timelines, strict=True):
        if line.method == "a2po":
            sets.setdefault(_value_set_of(run), []).append(line)
    saved_tokens = saved_seconds = 0.0
    sampled = 0
    for members in sets.values():
        payers = [t for t in members if t.stage1_tokens > t.stage1_reused_tokens]
        readers = [t for t in members if t.stage1_tokens <= t.stage1_reused_tokens]
        sampled += len(payers)
        if payers:
            for t in readers:
                charged = t.stage1_reused_tokens > 0
                saved_tokens += t.stage1_reused_tokens if charged else statistics.median(
                    p.stage1_tokens for p in payers)
                saved_seconds += t.stage1_reused_seconds if charged else statistics.median(
                    p.stage1_seconds for p in payers)
    return {"a2po_runs": sum(len(m) for m in sets.values()), "value_sets": len(sets), "sampled_runs": sampled,
            "saved_tokens": saved_tokens, "saved_seconds": saved_seconds}


def _value_set_of(run: Mapping[str, Any]) -> Any:
    """The V* set a run uses or will use: its spec's stage-1 fingerprint (a queued run has no set yet), else the set
    it has, else the run alone."""
    from a2po.runspec import value_fingerprint_of

    return value_fingerprint_of(dict(run.get("config") or {})) or run.get("value_set_id") or f"run{run.get('id')}"


def savings_line(summary: StudySummary) -> str:
    """The stage-1 savings as a sentence for the page."""
    s = summary.stage_one
    if not s.get("a2po_runs"):
        return "No A*-PO run in this study: no stage 1 to share."
    if not s.get("sampled_runs"):
        return (f"{s['a2po_runs']} A*-PO runs over {s['value_sets']} V* set(s); stage 1 has not been sampled yet "
                "(or the sets were sampled by earlier runs).")
    return (f"{s['a2po_runs']} A*-PO runs over {s['value_sets']} V* set(s): stage 1 was sampled by "
            f"{s['sampled_runs']} run(s) and read from the stored rows by the others, which saved "
            f"{s['saved_tokens']:,.0f} completion tokens and {format_duration(s['saved_seconds'])} of sampling "
            "(each run that read the set would have sampled it again).")
