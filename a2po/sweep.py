"""Sweeps: one run per point of a grid of settings and per run seed, with stage 1 sampled once per V* set.

    python -m a2po sweep --grid beta2=1e-3,1e-2 --grid learning_rate=1e-5,2e-5 --seeds 0 1 2 --num_train_epochs 1

A*-PO's stage 1 (N reference samples per prompt, scored) depends only on the model, the prompts, the rewards, N, the
sampling settings and its seed (`A2POTrainer.value_fingerprint`), not on beta1, beta2, the learning rate, the filter
or the epochs: V* is recomputed from the stored rewards with each run's beta1. Every run of a sweep samples stage 1
with the base's seed (`values_seed`; the run seeds vary stage 2), so the runs hand their V* tables on
(`A2POTrainer.set_optimal_values`) and stage 1 is sampled once per sweep (once per value of a sampling setting in the
grid, e.g. N or the temperature).

Every other flag is `python -m a2po train`'s (the preset, then the flags). The runs go one after another in this
process; each writes `<output_dir>/<run name>/`, and `<output_dir>/sweep.jsonl` gets one line per finished run, with
its whole spec. A sweep started again skips the runs whose spec is there; a folder keeps the base flags it was started
with (`<output_dir>/sweep_flags.json`) and refuses others. At the end: one row per grid point with the median over
seeds of the final held-out accuracy, its range, the best accuracy and its step, training time, completion tokens and
compute.

    python -m a2po sweep --grid learning_rate=1e-5,3e-5,1e-4 --seeds 0 1 2 --halving --max_train_flops 4e13 \
        --num_train_epochs 20

`--halving` (or `--halving '{"reduction_factor": 3, "rungs": 3}'`) stops weak points early: successive halving
(`Halving`, docs/studies.md): every point trains with the first seed on a share of the budget, the best third go on,
the last rung with every seed; the table marks the others "pruned at rung r".

Time and tokens are stage 1 (the train split's) and stage 2: every run that reads a V* set is charged what sampling it
cost, on its clock too (`max_train_seconds`), whichever run sampled it, so points compare on what each would cost alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2po.shown import shown

MAX_VALUES = 12  # values of one grid field
NOT_SWEPT = {"seed": "give run seeds (--seeds / seeds) instead of a grid over seed",
             "output_dir": "each run gets its own folder", "run_name": "the sweep names its runs"}


class GridError(ValueError):
    """A grid that cannot be swept; the message names the setting and the fix."""


def _config_classes() -> dict[str, type]:
    from a2po.runspec import CONFIG_CLASSES

    return CONFIG_CLASSES


def field_kind(name: str) -> type | None:
    """The Python type of config field `name` (from its default in either method's config); None if unknown or
    without a default to tell."""
    for cls in _config_classes().values():
        found = cls.__dataclass_fields__.get(name)
        if found is not None:
            default = found.default_factory() if found.default is dataclasses.MISSING else found.default
            return type(default) if default is not None else None
    return None


def coerce(name: str, value: Any) -> Any:
    """A grid value as the field takes it: text ("1e-3", "true") becomes a number or a bool."""
    kind = field_kind(name)
    if not isinstance(value, str):
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value
    text = value.strip()
    if kind is bool or text.lower() in ("true", "false"):
        if text.lower() not in ("true", "false", "on", "off", "1", "0"):
            raise GridError(f"grid: {name} takes true or false (got {shown(value, 30)}).")
        return text.lower() in ("true", "on", "1")
    if kind is str:
        return text
    try:
        number = float(text)
    except ValueError:
        if kind in (int, float):
            raise GridError(f"grid: {name} takes numbers, e.g. 1e-5, 2e-5 (got {shown(value, 30)}).") from None
        return text
    return int(number) if kind is int and number == int(number) else number


def parse_grid(grid: Any, allow_method: bool = True) -> dict[str, list[Any]]:
    """The grid as {field: [values]}, from a mapping of lists (or of texts "1e-3, 1e-2"), checked: settings of A*-PO's
    or GRPO's config (or `method`), one or more values each, no value twice. None or empty: {}."""
    if grid is None or grid == {} or grid == "":
        return {}
    if not isinstance(grid, dict):
        raise GridError('grid: give a mapping of settings to lists of values, e.g. {"beta2": [0.001, 0.01]} '
                        f"(got {type(grid).__name__}).")
    methods = tuple(_config_classes())
    known = {name for cls in _config_classes().values() for name in cls.__dataclass_fields__}
    parsed: dict[str, list[Any]] = {}
    for name, values in grid.items():
        name = str(name).strip()
        if name in parsed:
            raise GridError(f"grid: {shown(name)} is given twice; put all its values under one name.")
        if name in NOT_SWEPT:
            raise GridError(f"grid: {name} cannot be swept: {NOT_SWEPT[name]}.")
        if name == "method" and not allow_method:
            raise GridError("grid: this sweep runs one method; compare methods with the studio's /launch_study "
                            "(method in its grid) or \"A*-PO vs GRPO\".")
        if name != "method" and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise GridError(f"grid: {shown(name)} is not a setting of A*-PO's or GRPO's config.{hint}")
        items = values.replace(",", " ").split() if isinstance(values, str) else values
        if not isinstance(items, (list, tuple)) or not items:
            raise GridError(f"grid: give {name} a list of one or more values (got {shown(values)}).")
        if len(items) > MAX_VALUES:
            raise GridError(f"grid: at most {MAX_VALUES} values of {name} (got {len(items)}).")
        coerced = [coerce(name, v) for v in items]
        if name == "method" and (bad := [m for m in coerced if m not in methods]):
            raise GridError(f"grid: method takes {', '.join(methods)} (got {shown(bad[0], 20)}).")
        if len({repr(v) for v in coerced}) != len(coerced):
            raise GridError(f"grid: each value of {name} once (got {', '.join(map(str, coerced))}).")
        parsed[name] = coerced
    return parsed


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, the first field varying slowest; one empty point for no grid."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(grid[n] for n in names))]


def show_value(value: Any) -> str:
    """A grid value as people write it: 1.0 -> "1", 1e-05 -> "1e-05", True -> "True"."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def point_label(point: dict[str, Any]) -> str:
    """ "beta2=0.001, learning_rate=1e-05" (the point's settings in grid order), or "base" for no grid."""
    return ", ".join(f"{k}={show_value(v)}" for k, v in point.items()) or "base"


def point_slug(point: dict[str, Any]) -> str:
    """A run-name part for a point: "beta2=0.001-learning_rate=1e-05" ("base" for no grid)."""
    return "-".join(f"{k}={show_value(v)}" for k, v in point.items()) or "base"


# ----------------------------------------------------------------------------------------------------------------
# Successive halving: every point to a first rung, the best fraction on to the next


MAX_RUNGS = 4
SEARCHES = ("grid", "random")


@dataclass(frozen=True)
class Halving:
    """Successive halving over a sweep's points (docs/studies.md, "Sweeps that stop weak points early").

    Every point trains to rung 0 with the first run seed; at each rung the best 1/`reduction_factor` of the points
    (by held-out accuracy at the rung's end, the median over the seeds run so far) go on to the next, the others are
    pruned; the last rung runs every seed. Rung r spends `share(r)` of the budget's training part (what stage 1
    leaves of `max_train_flops` or `max_train_seconds`): 1/9, 1/3 and all of it for 3 rungs of factor 3. A rung
    restarts its points from scratch with the same seed and evaluation grid, so its history up to the rung before
    is the earlier run's, step for step, under a compute budget.

    `search` "random" trains `trials` points drawn from the grid (Optuna's seeded `RandomSampler`) instead of all
    of them."""

    reduction_factor: int = 3
    rungs: int = 3
    search: str = "grid"
    trials: int | None = None
    sampler_seed: int = 0

    def share(self, rung: int) -> float:
        """The share of the budget's training part that rung `rung` spends."""
        return float(self.reduction_factor) ** -(self.rungs - 1 - rung)

    def kept(self, points: int, rung: int) -> int:
        """How many of `points` grid points train at rung `rung` (ties broken, so never more)."""
        for _ in range(rung):
            points = max(1, points // self.reduction_factor)
        return points

    def max_runs(self, points: int, seeds: int) -> int:
        """The most runs the sweep can make: every rung's points, the last with each seed."""
        return sum(self.kept(points, r) * (seeds if r == self.rungs - 1 else 1) for r in range(self.rungs))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def parse(cls, value: Any) -> Halving | None:
        """A halving from a mapping ({"reduction_factor": 3, "rungs": 3}, {"search": "random", "trials": 12}), True
        for the defaults, None / False / {} for none; `GridError` naming the setting and the fix."""
        if value in (None, False, {}, ""):
            return None
        if value is True:
            return cls()
        if not isinstance(value, dict):
            raise GridError('halving: give a mapping, e.g. {"reduction_factor": 3, "rungs": 3} (or true for those).')
        known = {f.name for f in dataclasses.fields(cls)}
        if other := [k for k in value if k not in known]:
            raise GridError(f"halving: {str(other[0])[:40]!r} is not a setting of halving; it takes "
                            f"{', '.join(sorted(known))}.")
        made = {}
        for name in ("reduction_factor", "rungs", "trials", "sampler_seed"):
            if name in value and value[name] is not None:
                number = value[name]
                if isinstance(number, bool) or not isinstance(number, int):
                    raise GridError(f"halving: {name} takes a whole number (got {str(number)[:40]!r}).")
                made[name] = number
        if "search" in value:
            made["search"] = value["search"]
        halving = cls(**made)
        if not 2 <= halving.reduction_factor <= 8:
            raise GridError(f"halving: reduction_factor keeps 1 in that many points at each rung: give 2 to 8 "
                            f"(got {halving.reduction_factor}); 3 is usual.")
        if not 2 <= halving.rungs <= MAX_RUNGS:
            raise GridError(f"halving: rungs counts the budgets a point may reach: give 2 to {MAX_RUNGS} "
                            f"(got {halving.rungs}).")
        if halving.search not in SEARCHES:
            raise GridError(f"halving: search is one of {', '.join(SEARCHES)} (got {str(halving.search)[:40]!r}).")
        if (halving.search == "random") != (halving.trials is not None):
            raise GridError("halving: a random search draws `trials` points of the grid (give both, e.g. "
                            '{"search": "random", "trials": 12}); a grid search trains every point (give neither).')
        if halving.trials is not None and not 1 <= halving.trials <= MAX_VALUES ** 2:
            raise GridError(f"halving: trials must be 1 to {MAX_VALUES ** 2} (got {halving.trials}).")
        if not 0 <= halving.sampler_seed < 2**32:
            raise GridError(f"halving: sampler_seed must be 0 to {2**32 - 1} (got {halving.sampler_seed}).")
        return halving

    def points(self, grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
        """The points the sweep trains: the grid's (`grid_points`), or for a random search `trials` of them drawn by
        Optuna's `RandomSampler` (each setting's value drawn from the grid's, seeded by `sampler_seed`: the same
        points every time), each once, in grid order."""
        size = math.prod(len(values) for values in grid.values())
        if self.search == "grid" or self.trials is None or self.trials >= size:
            return grid_points(grid)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=self.sampler_seed))
        places = {name: {repr(v): i for i, v in enumerate(values)} for name, values in grid.items()}
        drawn: dict[tuple[int, ...], dict[str, Any]] = {}
        while len(drawn) < self.trials:
            trial = study.ask()
            point = {name: values[trial.suggest_int(name, 0, len(values) - 1)] for name, values in grid.items()}
            study.tell(trial, 0.0)
            drawn.setdefault(tuple(places[name][repr(v)] for name, v in point.items()), point)
        return [drawn[key] for key in sorted(drawn)]


def rung_share(study: dict[str, Any] | None) -> float:
    """The share of its budget's training part a run of a study spends (`RunCounters.budget_share`): its rung's
    (`Halving.share`) for a run of a halving sweep (its `study` label holds the halving and its rung), else 1."""
    halving = (study or {}).get("halving")
    if not isinstance(halving, dict):
        return 1.0
    return Halving(**halving).share(int(study.get("rung") or 0))


def promoted(values: dict[str, float | None], reduction_factor: int) -> set[str]:
    """The points (keys of `values`: each point's value at the rung, None for one with no value) that go on to the
    next rung: those Optuna's `SuccessiveHalvingPruner` does not prune, each judged against the values of every other
    point at that rung, all known before any is judged (synchronous halving: the order the runs ended in does not
    matter). Values should differ (break ties before: `rung_value`), so exactly max(1, n // reduction_factor) go on;
    a point without a value never does."""
    import optuna
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    scored = {key: value for key, value in values.items() if value is not None and math.isfinite(value)}
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=reduction_factor,
                                                    min_early_stopping_rate=0)
    failed = [-math.inf] * (len(values) - len(scored))  # points without a value still count among the competitors
    kept = set()
    for key, value in scored.items():
        study = optuna.create_study(direction="maximize", pruner=pruner)
        for other in [v for k, v in scored.items() if k != key] + failed:
            study.add_trial(create_trial(state=TrialState.PRUNED, intermediate_values={1: other},
                                         system_attrs={"completed_rung_0": other}))
        trial = study.ask()
        trial.report(value, step=1)
        if not trial.should_prune():
            kept.add(key)
    return kept


def rung_value(finals: list[float], curves: list[list[float]], order: int) -> float | None:
    """A point's value at a rung: the median over its seeds of the final held-out accuracy, then, to break ties,
    the median over seeds of the mean accuracy of each run's evaluations at this rung (a point that got there sooner
    ranks first), then the point's place in the grid (the earlier first). None when no run finished."""
    if not finals:
        return None
    area = statistics.median(sum(c) / len(c) for c in curves) if curves and all(curves) else 0.0
    return statistics.median(finals) + 1e-4 * area - 1e-9 * order


# ----------------------------------------------------------------------------------------------------------------
# The command


def _sweep_flags(argv: list[str]) -> tuple[dict[str, str], list[int], str | None, list[str]]:
    """`--grid NAME=V1,V2` (repeatable), `--seeds S [S ...]` and `--halving JSON` (or `--halving` alone: the
    defaults) taken out of `argv`; the rest is train's flags."""
    grid: dict[str, str] = {}
    seeds: list[int] = []
    halving: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--grid" or arg.startswith("--grid="):
            value = arg.split("=", 1)[1] if "=" in arg and arg.startswith("--grid=") else None
            if value is None:
                if i + 1 >= len(argv):
                    raise SystemExit("--grid needs NAME=V1,V2, e.g. --grid beta2=1e-3,1e-2")
                value, i = argv[i + 1], i + 1
            name, equals, values = value.partition("=")
            if not equals or not values.strip():
                raise SystemExit(f"--grid needs NAME=V1,V2, e.g. --grid beta2=1e-3,1e-2 (got {value!r}).")
            if name.strip() in grid:
                raise SystemExit(f"--grid {name.strip()} is given twice: put all its values in one flag.")
            grid[name.strip()] = values
        elif arg == "--halving":
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            halving, i = (argv[i + 1], i + 1) if has_value else ("true", i)
        elif arg == "--seeds":
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                try:
                    seeds.append(int(argv[i]))
                except ValueError:
                    raise SystemExit(f"--seeds takes whole numbers, e.g. --seeds 0 1 2 (got {argv[i]!r}).") from None
        else:
            rest.append(arg)
        i += 1
    if "--seed" in rest:
        raise SystemExit("A sweep takes --seeds S [S ...] (one run per seed); drop --seed.")
    return grid, seeds, halving, rest


def _final_figures(trainer: Any, charged: tuple[float, int, float]) -> dict[str, Any]:
    """What a sweep's table reads of a finished run: held-out accuracy (final, best and its step, and the mean over
    its evaluations after the first, for halving's ties) and its clock and compute, stage 1 included (what this run
    sampled of it, `stage1_*`, and what its V* set cost, `charged` before it ran)."""
    evals = [(h["step"], h["eval_accuracy"]) for h in trainer.state.log_history if "eval_accuracy" in h]
    counters = trainer.run_counters
    best = max(evals, key=lambda p: p[1], default=(None, None))
    stage_one = counters.values_seconds.get("train", 0.0)
    stage_one_tokens = counters.values_tokens.get("train", 0)
    stage_one_flops = counters.values_flops.get("train", 0.0)
    return {"final_accuracy": evals[-1][1] if evals else None, "best_accuracy": best[1], "best_step": best[0],
            "curve": [a for _, a in evals[1:]] or [a for _, a in evals],
            "steps": trainer.state.global_step, "stage1_seconds": round(stage_one - charged[0], 2),
            "stage1_tokens": stage_one_tokens - charged[1], "stage1_flops": stage_one_flops - charged[2],
            "train_seconds": round(counters.train_seconds, 2), "train_tokens": counters.completion_tokens,
            "training_seconds": round(stage_one + counters.train_seconds, 2),
            "completion_tokens": counters.completion_tokens + stage_one_tokens, "compute_flops": counters.compute}


def summarize_sweep(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per grid point, in grid order: medians over its seeds (final and best accuracy, training time,
    tokens, compute), the range of the final accuracy, and the seeds it ran. With halving (rows with a `rung`), a
    point is read at the highest rung it reached, and one left out of the next rung is "pruned at rung r"."""
    top = max((r.get("rung", 0) for r in results), default=0)
    reached: dict[str, int] = {}
    for result in results:
        reached[result["point_label"]] = max(reached.get(result["point_label"], 0), result.get("rung", 0))
    rows: dict[str, dict[str, Any]] = {}
    for result in results:
        label = result["point_label"]
        if result.get("rung", 0) == reached[label]:
            rows.setdefault(label, {"point": label, "runs": []})["runs"].append(result)

    def median(runs: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    table = []
    for row in rows.values():
        runs = row.pop("runs")
        finals = [r["final_accuracy"] for r in runs if r.get("final_accuracy") is not None]
        halved = "rung" in runs[0]
        row.update(seeds=len(runs), final_accuracy=median(runs, "final_accuracy"),
                   final_min=min(finals, default=None), final_max=max(finals, default=None),
                   best_accuracy=median(runs, "best_accuracy"), best_step=median(runs, "best_step"),
                   training_seconds=median(runs, "training_seconds"),
                   completion_tokens=median(runs, "completion_tokens"), compute_flops=median(runs, "compute_flops"),
                   state=("" if not halved else f"pruned at rung {reached[row['point']]}"
                          if reached[row["point"]] < top else f"rung {reached[row['point']]}"))
        table.append(row)
    return table


def format_table(table: list[dict[str, Any]]) -> str:
    """The sweep's table as text: the best final median marked with *, or every point tied at it with = (no point
    is better than another there), and footnotes that say so and what time and tokens count. With halving, only a
    point of the last rung can be the best, and the pruned ones say where they stopped."""
    from a2po.compute import format_flops

    def pct(v: float | None) -> str:
        return "–" if v is None else f"{100 * v:.1f}%"

    halved = any(r.get("state") for r in table)
    eligible = [r for r in table if not r.get("state", "").startswith("pruned")]
    best = max((r["final_accuracy"] for r in eligible if r["final_accuracy"] is not None), default=None)
    tied = sum(best is not None and r["final_accuracy"] == best for r in eligible)
    lines = [f"{'grid point':<40} {'seeds':>5} {'final (median)':>14} {'range':>15} {'best (step)':>14} "
             f"{'train time':>10} {'tokens':>9} {'compute':>12}" + (f" {'halving':<16}" if halved else "")]
    for r in table:
        top = r in eligible and best is not None and r["final_accuracy"] == best
        mark = ("*" if tied == 1 else "=") if top else " "
        spread = f"{pct(r['final_min'])}-{pct(r['final_max'])}"
        step = "" if r["best_step"] is None else f" ({r['best_step']:g})"
        time_s = "–" if r["training_seconds"] is None else f"{r['training_seconds']:.0f} s"
        tokens = "–" if r["completion_tokens"] is None else f"{r['completion_tokens']:,.0f}"
        lines.append(f"{mark}{r['point'][:39]:<39} {r['seeds']:>5} {pct(r['final_accuracy']):>14} {spread:>15} "
                     f"{pct(r['best_accuracy']) + step:>14} {time_s:>10} {tokens:>9} "
                     f"{format_flops(r.get('compute_flops')):>12}" + (f" {r.get('state', ''):<16}" if halved else ""))
    if tied == 1:
        lines.append("* the best final median" + (" (of the points of the last rung)" if halved else ""))
    elif tied > 1:
        lines.append(f"= {tied} grid points tie for the best final median ({pct(best)}): more seeds or held-out "
                     "prompts may tell them apart")
    lines.append("train time, tokens, compute: medians of stage 1 (sampling the V* set for the train split, charged in "
                 "full to every run that reads it) plus stage 2 (training); evaluations not counted")
    return "\n".join(lines)


def _saved_tables(root: Path, fingerprint: str) -> dict[str, list[dict[str, Any]]]:
    """V* rows that earlier runs of this sweep saved under `root` for `fingerprint`, by split."""
    from a2po.values import read_jsonl

    found: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(root.glob(f"*/optimal_values-*-{fingerprint}*.jsonl")):
        split = path.name[len("optimal_values-"):].split(f"-{fingerprint}")[0]
        for row in read_jsonl(path):
            found.setdefault(split, {})[row["prompt_id"]] = row
    return {split: list(rows.values()) for split, rows in found.items()}


def _spec_flags(spec: Any) -> dict[str, Any]:
    """The flags that make a run what it is (`RunSpec.to_config_dict`, as JSON reads them back), not its folder."""
    flags = json.loads(json.dumps(spec.to_config_dict(), default=str))
    flags.pop("output_dir", None)
    return flags


def _check_folder(root: Path, base: dict[str, Any]) -> None:
    """Record the base flags of the sweep in `root`, or exit naming those that differ from the ones recorded: the
    finished runs there are another sweep's."""
    path = root / "sweep_flags.json"
    if not path.exists():
        path.write_text(json.dumps(base, indent=2))
        return
    there = json.loads(path.read_text())

    def show(flags: dict[str, Any], name: str) -> str:
        return json.dumps(flags[name]) if name in flags else "not given"

    differ = [name for name in {**there, **base} if show(there, name) != show(base, name)]
    if differ:
        listed = "; ".join(f"--{name} {show(there, name)} there, {show(base, name)} now" for name in differ)
        raise SystemExit(f"{root} holds a sweep started with other flags ({listed}), so its finished runs are not "
                         f"this sweep's. Give this sweep another --output_dir, or continue that one with the flags "
                         f"in {path}.")


@dataclass
class _Runner:
    """What every run of a command-line sweep shares: its folder and log, the train flags, the stage-1 seed, what
    each V* set cost and its tables (handed from run to run), and the runs finished earlier (by spec and rung)."""

    root: Path
    script: Any
    fields: dict[str, Any]
    base_name: str
    values_seed: dict[str, Any]
    done: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    costs: dict[str, tuple[float, int, float]] = dataclasses.field(default_factory=dict)
    tables: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.root / "sweep.jsonl"

    def read_log(self) -> None:
        """The runs an earlier start of this sweep finished, and what they paid for their V* sets."""
        for line in self.log_path.read_text().splitlines() if self.log_path.exists() else []:
            if line.strip():
                row = json.loads(line)
                if "spec" in row:
                    self.done[_done_key(row["spec"], row.get("rung"))] = row
                if row.get("values_set"):
                    self.add_cost(row["values_set"], row)

    def add_cost(self, key: str, row: dict[str, Any]) -> None:
        seconds, tokens, flops = self.costs.get(key, (0.0, 0, 0.0))
        self.costs[key] = (seconds + row["stage1_seconds"], tokens + row["stage1_tokens"],
                           flops + row.get("stage1_flops", 0.0))

    def run(self, point: dict[str, Any], seed: int, rung: int | None, share: float, where: str) -> dict[str, Any]:
        """One run of the sweep (`rung` and `share`: of a halving), or its row from an earlier start."""
        from a2po.cli import spec_from_args

        label = point_label(point)
        name = f"{self.base_name}-{point_slug(point)}" + ("" if rung is None else f"-r{rung}") + f"-s{seed}"
        run_fields = {**self.values_seed, **self.fields, **point, "seed": seed, "run_name": name}
        run_fields.pop("output_dir", None)
        spec = spec_from_args("train", self.script, dict(run_fields))
        flags = _spec_flags(spec)
        what = f"{where} {label}, seed {seed}" + ("" if rung is None else f", rung {rung}")
        if (earlier := self.done.get(_done_key(flags, rung))) is not None:
            print(f"{what}: done earlier ({self.log_path})", flush=True)
            return earlier
        print(what, flush=True)
        trainer = spec.build_trainer(output_dir=str(self.root / name))
        trainer.run_counters.budget_share = share
        key = trainer.value_fingerprint() if getattr(trainer, "samples_stage_one", False) else None
        if key is not None and key not in self.tables:  # a sweep started again: the tables its earlier runs saved
            self.tables[key] = _saved_tables(self.root, key)
        for split, table in self.tables.get(key, {}).items():
            trainer.set_optimal_values(table, split)
        charged = self.costs.get(key, (0.0, 0, 0.0))
        if key is not None:  # whichever run sampled the V* set, each run that reads it pays for it, as it would alone
            trainer.run_counters.restore_values("train", *charged)
        trainer.train()
        if trainer.eval_dataset is not None and not any(
                h.get("step") == trainer.state.global_step and "eval_accuracy" in h for h in trainer.state.log_history):
            trainer.evaluate()
        trainer.save_model(str(self.root / name))
        figures = _final_figures(trainer, charged)
        if key is not None:
            self.tables.setdefault(key, {}).update(trainer.value_tables)
            self.add_cost(key, figures)
        result = {"point": point, "point_label": label, "seed": seed, "run_name": name, "spec": flags,
                  "values_set": key, **({} if rung is None else {"rung": rung}), **figures}
        with self.log_path.open("a") as log:
            log.write(json.dumps(result) + "\n")
        return result


def _done_key(flags: dict[str, Any], rung: int | None) -> str:
    return json.dumps(flags if rung is None else {"spec": flags, "rung": rung}, sort_keys=True)


def _halved(runner: _Runner, halving: Halving, grid: dict[str, list[Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """The runs of a halving sweep, rung by rung: every point with the first seed on its share, the points
    `promoted` keeps on to the next rung, the last with every seed."""
    kept, results = halving.points(grid), []
    order = {point_label(p): i for i, p in enumerate(kept)}
    for rung in range(halving.rungs):
        last = rung == halving.rungs - 1
        plan = [(point, seed) for point in kept for seed in (seeds if last else seeds[:1])]
        mine = [runner.run(point, seed, rung, halving.share(rung), f"[rung {rung}: {i}/{len(plan)}]")
                for i, (point, seed) in enumerate(plan, 1)]
        results += mine
        if last:
            break
        values = {point_label(p): rung_value([r["final_accuracy"] for r in mine if r["point_label"] == point_label(p)
                                              and r["final_accuracy"] is not None],
                                             [r.get("curve") or [] for r in mine if r["point_label"] == point_label(p)],
                                             order[point_label(p)]) for p in kept}
        going_on = promoted(values, halving.reduction_factor)
        print(f"rung {rung}: {len(going_on)} of {len(kept)} points go on ({', '.join(sorted(going_on))}); the others "
              "are pruned", flush=True)
        kept = [p for p in kept if point_label(p) in going_on]
    return results


def run_sweep(argv: list[str]) -> int:
    """`python -m a2po sweep ...` (see the module docstring)."""
    from a2po.cli import parse, register_rewards, spec_from_args

    grid_text, seeds, halving_text, rest = _sweep_flags(argv)
    try:
        grid = parse_grid(grid_text, allow_method=False)
        halving = Halving.parse(json.loads(halving_text)) if halving_text is not None else None
    except (GridError, json.JSONDecodeError) as error:
        raise SystemExit(f"--halving: {error}" if isinstance(error, json.JSONDecodeError) else str(error)) from None
    if not grid and not seeds:
        raise SystemExit("usage: python -m a2po sweep --grid NAME=V1,V2 [--grid ...] [--seeds 0 1 2] "
                         "[--halving '{\"reduction_factor\": 3, \"rungs\": 3}'] [train flags]")
    seeds = seeds or [0]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds: each seed once (got {' '.join(map(str, seeds))}).")
    _, script, config, fields = parse(["train", *rest])
    if fields.get("resume_from_checkpoint") not in (None, "", False):
        raise SystemExit("A sweep continues by itself: run the same command again and it skips the runs it finished "
                         "(an interrupted run starts over); drop --resume_from_checkpoint.")
    for name in grid:
        if name not in type(config).__dataclass_fields__:
            raise SystemExit(f"--grid {name}: not a setting of {type(config).__name__} (--method {script.method}).")
    if halving is not None and not (config.max_train_flops or config.max_train_seconds):
        raise SystemExit("--halving stops points at shares of a budget: give one, --max_train_flops (compute, the "
                         "same on any machine) or --max_train_seconds, and --num_train_epochs enough to spend it.")
    register_rewards(script)
    if script.num_processes != 1:
        raise SystemExit("A sweep runs its runs one after another in one process: drop --num_processes.")
    base_name = fields.get("run_name") or "sweep"
    root = Path(config.output_dir or Path("outputs") / base_name)
    root.mkdir(parents=True, exist_ok=True)
    base = spec_from_args("train", script, dict(fields))
    _check_folder(root, {**{k: v for k, v in _spec_flags(base).items() if k != "run_name"},
                         **({"halving": halving.to_dict()} if halving else {})})
    # One stage 1 for the whole sweep: every run samples its reference completions with the base's seed.
    stage_one_seed = base.config.get("values_seed")
    stage_one_seed = base.config.get("seed", config.seed) if stage_one_seed is None else stage_one_seed
    values_seed = {"values_seed": stage_one_seed} if "values_seed" in type(config).__dataclass_fields__ else {}
    runner = _Runner(root, script, fields, base_name, values_seed)
    runner.read_log()
    started = time.time()
    if halving is None:
        plan = [(point, seed) for point in grid_points(grid) for seed in seeds]
        results = [runner.run(point, seed, None, 1.0, f"[{i}/{len(plan)}]") for i, (point, seed) in enumerate(plan, 1)]
    else:
        results = _halved(runner, halving, grid, seeds)
    table = summarize_sweep(results)
    shared = (f"; stage 1 sampled for {len(runner.tables)} V* set(s), each read by the other runs"
              if runner.tables else "")
    print(f"\nSweep {base_name}: {len(results)} runs ({len(table)} grid points, {len(seeds)} seed(s)"
          f"{', halved' if halving else ''}), {time.time() - started:.0f} s in this process{shared}.", flush=True)
    print(format_table(table), flush=True)
    (root / "summary.json").write_text(json.dumps(table, indent=2))
    print(f"Runs: {runner.log_path}; table: {root / 'summary.json'}", file=sys.stderr, flush=True)
    return 0
