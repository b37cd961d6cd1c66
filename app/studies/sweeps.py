"""Sweeps: one base spec, a grid of settings and run seeds; every run of the study, and what they share.

    grid = {"beta2": [1e-3, 1e-2], "learning_rate": [1e-5, 2e-5]}      ->  4 grid points x each seed
    grid = {"method": ["a2po", "grpo"], "learning_rate": [1e-5, 2e-5]}  ->  each method at each learning rate

A grid names settings of the method's config (`A2POConfig` / `GRPOConfig` fields) and, optionally, `method`. With
`method` in the grid, each point's A*-PO and GRPO runs are the pair "A*-PO vs GRPO" makes under the paper's protocol
(`protocols.pair_specs`: every prompt, A*-PO's filter off unless the grid sweeps it, the same prompts per step and the
same steps, G = N, one grid of evaluations for the pair): every A*-PO point has its own GRPO match, and a GRPO run
that two points would make alike (they differ in a setting only A*-PO has, e.g. beta2) is made once.

Without `method`, every run of a sweep is evaluated on one absolute grid of steps (`protocols.EVAL_POINTS` points over
the longest run), so curves of different points read at the same steps; a base spec with a time budget
(`max_train_seconds`, `eval_every_seconds`) keeps its grid of seconds instead, for a sweep at equal training time.
The grid's size (a product of its lengths) is checked before any run is made: a refused grid costs nothing that grows
with it.

Stage 1 depends only on the model, the prompts, the rewards, N, the sampling settings and its seed
(`RunSpec.value_fingerprint`), and every A*-PO run of a sweep gets the base spec's stage-1 seed (`values_seed`):
points that differ in beta1, beta2, the learning rate, the filter or the epochs, and every run seed, share one V* set,
sampled once (`shared_stage_one`); the run seeds vary stage 2.

With `halving` (`a2po.sweep.Halving`) the sweep stops weak points early: only rung 0 is launched, each point with the
first run seed, and `next_rung` makes each later rung from the stored runs of the one before, once all of them ended
(the studio's `Services.advance_studies` launches it): the points Optuna's successive-halving rule keeps, the last
rung with every seed; the others are pruned. Rung r spends its share of the budget's training part
(`Halving.share`, `RunCounters.budget_share`), so a halving sweep needs a budget, of compute (any machine) or time.
"""

from __future__ import annotations

import copy
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from a2po import sweep
from a2po.shown import shown
from app.studies.protocols import EVAL_POINTS, SHARED_SETTINGS, StudyError, pair_specs, planned_steps

ENDED = ("stopped", "interrupted", "finished", "failed")  # `storage.lifecycle.ENDED`: no process, nothing waits

MAX_RUNS = 64  # runs in one study, whatever the studio's own limits (those are checked as well)
# The A*-PO setting a GRPO match is made from that GRPO has no field for (`pair_specs`: G = N): a GRPO run's grid point
# names it, so each N has its own GRPO row.
MATCHED_FROM_A2PO = ("num_value_samples",)


def parse_grid(grid: Any) -> dict[str, list[Any]]:
    """`a2po.sweep.parse_grid`, its refusals as `StudyError`; a setting named twice (" beta2 " is beta2) is refused."""
    if isinstance(grid, dict):
        names: dict[str, Any] = {}
        for name, values in grid.items():
            key = str(name).strip()
            if key in names:
                raise StudyError(f"grid: {shown(key)} is given twice; put all its values under one name.")
            names[key] = values
        grid = names
    try:
        return sweep.parse_grid(grid)
    except sweep.GridError as error:
        raise StudyError(str(error)) from None


def _run_for_point(base: dict[str, Any], point: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run spec of one grid point (its seed already set in `base`), and the settings of the point that apply
    to its method."""
    from a2po.runspec import METHOD_CONFIG_FIELDS  # torch: imported when a study is made, not with the pages

    own = base.get("method", "a2po")
    method = point.get("method", own)
    if method != own and own != "a2po":
        raise StudyError("grid: a sweep over method starts from an A*-PO spec (its GRPO runs are matched to it); "
                         f"this spec's method is {own!r}.")
    a2po_fields = METHOD_CONFIG_FIELDS["a2po"]
    settings = {k: v for k, v in point.items() if k != "method"}
    if "method" not in point:
        other = [k for k in settings if k not in METHOD_CONFIG_FIELDS[own]]
        if other:
            raise StudyError(f"grid: {other[0]} is not a setting of {own} runs, and this sweep runs only {own}: remove "
                             "it, or add method: a2po, grpo to the grid to sweep both methods.")
        run = copy.deepcopy(base)
        run.setdefault("config", {}).update(settings)
    else:  # both methods: the pair "A*-PO vs GRPO" makes from this point's A*-PO run (the paper's protocol)
        a2po = copy.deepcopy(base)
        a2po.setdefault("config", {}).update({k: v for k, v in settings.items() if k in a2po_fields})
        pair = dict(zip(("a2po", "grpo"), pair_specs(a2po, "paper"), strict=True))
        matched = set(pair["grpo"]["config"]) - set(SHARED_SETTINGS)  # G and the batch, from A*-PO's N and batch
        if fixed := [k for k in settings if k in matched and k not in a2po_fields]:
            raise StudyError(f"grid: {fixed[0]} of a GRPO run is matched to its A*-PO run (G = N, the same prompts "
                             "per step); sweep num_value_samples or per_device_train_batch_size instead.")
        run = pair[method]
        run["config"].update({k: v for k, v in settings.items()
                              if k in METHOD_CONFIG_FIELDS[method] and k not in matched})
        run["name"] = base.get("name")
    applies = METHOD_CONFIG_FIELDS[method] | set(MATCHED_FROM_A2PO)
    applied = {**({"method": method} if "method" in point else {}),
               **{k: v for k, v in settings.items() if k in applies}}
    return run, applied


def parse_halving(value: Any) -> sweep.Halving | None:
    """`a2po.sweep.Halving.parse`, its refusals as `StudyError`."""
    try:
        return sweep.Halving.parse(value)
    except sweep.GridError as error:
        raise StudyError(str(error)) from None


def _halving_problem(spec: dict[str, Any], grid: dict[str, list[Any]]) -> str | None:
    """Why `spec` and `grid` cannot be halved, or None."""
    config = spec.get("config") or {}
    if "method" in grid:
        return ("halving ranks the points of one method against each other: sweep each method on its own (no "
                "method in the grid), then compare their best points with \"A*-PO vs GRPO\".")
    if not (config.get("max_train_flops") or config.get("max_train_seconds")):
        return ("halving stops points at shares of a budget: give the base spec one, max_train_flops (compute, the "
                "same on any machine) or max_train_seconds (time).")
    if (spec.get("dataset") or {}).get("eval_size", 64) == 0:
        return "halving ranks points by held-out accuracy: set the dataset's eval_size above 0."
    return None


def sweep_specs(spec: dict[str, Any], grid: Any, seeds: list[int], *, study_id: str | None = None,
                eval_points: int = EVAL_POINTS, halving: sweep.Halving | None = None) -> list[dict[str, Any]]:
    """Every run of a sweep, point by point and seed by seed, each tagged with the study:
    `{"study": {"id", "name", "kind": "sweep", "seed", "seeds", "point", "grid"}}`; with `halving`, the runs of rung
    0 (each point once, with the first seed), tagged with `"halving"`, `"rung": 0` and `"seed_list"` too.

    `spec` is a checked run spec (the gate's); `seeds` run seeds (none: the spec's own). Refused (`StudyError`)
    with the field and the fix: an unknown field or value, or more than `MAX_RUNS` runs (for halving, at most)."""
    parsed = parse_grid(grid)
    if spec.get("action", "train") != "train":
        raise StudyError("A sweep compares training runs: set the action to \"train\".")
    own_seed = int((spec.get("config") or {}).get("seed") or 0)
    own_values_seed = (spec.get("config") or {}).get("values_seed")
    own_values_seed = own_seed if own_values_seed is None else int(own_values_seed)
    seeds = list(seeds) or [own_seed]
    if halving and (problem := _halving_problem(spec, parsed)):
        raise StudyError(problem)
    points = math.prod(len(values) for values in parsed.values())  # counted before any point is made
    trained = min(points, halving.trials or points) if halving else points
    runs_made = halving.max_runs(trained, len(seeds)) if halving else points * len(seeds)
    if runs_made > MAX_RUNS:
        what = (f"up to {runs_made} runs with halving ({trained} points at rung 0, the last rung's with "
                f"{len(seeds)} seeds)" if halving else f"{points} grid points x {len(seeds)} seeds = {runs_made} runs")
        raise StudyError(f"This sweep makes {what}; a study has at most {MAX_RUNS}. Sweep fewer values or seeds.")
    grid_points = halving.points(parsed) if halving else sweep.grid_points(parsed)
    sid = study_id or uuid.uuid4().hex[:10]
    name = str(spec.get("name") or "sweep")[:80]
    runs, seen = [], set()
    for point in grid_points:
        for seed in seeds[:1] if halving else seeds:
            base = copy.deepcopy(spec)
            base.setdefault("config", {})["seed"] = seed
            run, applied = _run_for_point(base, point)
            if run.get("method", "a2po") == "a2po" and run["config"].get("values_seed") is None:
                run["config"]["values_seed"] = own_values_seed  # one stage 1 for every seed of the study
            key = json.dumps({k: v for k, v in run.items() if k != "name"}, sort_keys=True, default=repr)
            if key in seen:
                continue  # a setting of the other method only: this run is already in the study
            seen.add(key)
            run["name"] = f"{name}-{sweep.point_slug(applied)}" + (f"-s{seed}" if len(seeds) > 1 else "")
            run["study"] = {"id": sid, "name": name, "kind": "sweep", "seed": seed, "seeds": len(seeds),
                            "point": applied, "grid": parsed}
            if halving:
                run["name"] = f"{name}-{sweep.point_slug(applied)}-r0"
                run["study"].update(halving=halving.to_dict(), rung=0, seed_list=seeds)
                _budget_grid(run["config"], eval_points)
            runs.append(run)
    _one_step_grid(runs, eval_points)
    return runs


def _budget_grid(config: dict[str, Any], eval_points: int) -> None:
    """A halving run without its own evaluation grid is evaluated on its budget's (every 1/`eval_points` of it), so
    every rung's runs read at the same compute or time, and a rung's history is a prefix of the next one's."""
    if config.get("eval_steps") or config.get("eval_every_seconds") or config.get("eval_every_flops"):
        return
    if config.get("max_train_flops"):
        config["eval_every_flops"] = float(config["max_train_flops"]) / eval_points
    else:
        config["eval_every_seconds"] = float(config["max_train_seconds"]) / eval_points


def halving_of(run: dict[str, Any]) -> tuple[sweep.Halving, int] | None:
    """The halving of a stored run of a halving sweep and its rung, or None for any other run."""
    tag = ((run.get("config") or {}).get("study") or {})
    if tag.get("kind") != "sweep" or not isinstance(tag.get("halving"), dict):
        return None
    return sweep.Halving(**tag["halving"]), int(tag.get("rung") or 0)


@dataclass
class Rung:
    """One rung of a halving sweep read back: its runs by point, each point's value, and which went on."""

    number: int
    runs: dict[str, list[dict[str, Any]]]  # point label -> its runs at this rung
    values: dict[str, float | None]
    ended: bool  # every run of the rung ended
    promoted: set[str] | None = None  # the points of the next rung (None: not decided yet)


def halving_rungs(runs: Sequence[dict[str, Any]], finals: Mapping[int, tuple[float | None, list[float]]]
                  ) -> list[Rung]:
    """The rungs of one halving sweep's stored runs, in order: each point's value at its rung (`a2po.sweep.rung_value`
    of its finished runs' final held-out accuracy and evaluations, `finals` by run id), and for every rung but the
    top one the points that went on (those with a run at the next rung)."""
    by_rung: dict[int, dict[str, list[dict[str, Any]]]] = {}
    order: dict[str, int] = {}
    for run in sorted(runs, key=lambda r: r["id"]):
        found = halving_of(run)
        if found is None:
            continue
        label = sweep.point_label(run["config"]["study"]["point"])
        order.setdefault(label, len(order))
        by_rung.setdefault(found[1], {}).setdefault(label, []).append(run)
    rungs = []
    for number in sorted(by_rung):
        points = by_rung[number]
        values = {}
        for label, mine in points.items():
            done = [finals.get(r["id"], (None, []))[0] is not None and r["status"] == "finished" for r in mine]
            scored = [finals[r["id"]] for r, ok in zip(mine, done, strict=True) if ok]
            values[label] = sweep.rung_value([f for f, _ in scored], [c for _, c in scored], order[label])
        ended = all(r["status"] in ENDED for rs in points.values() for r in rs)
        rungs.append(Rung(number, points, values, ended))
    for lower, upper in zip(rungs, rungs[1:]):
        lower.promoted = set(upper.runs)
    return rungs


def next_rung(runs: Sequence[dict[str, Any]], finals: Mapping[int, tuple[float | None, list[float]]]
              ) -> list[dict[str, Any]]:
    """The specs of a halving sweep's next rung (`runs`: its stored runs, `finals` as `halving_rungs` takes them),
    or [] while its top rung has runs that have not ended, or when the last rung is done. The points that go on are
    `a2po.sweep.promoted`'s (Optuna's successive-halving rule) of the top rung's values; each gets its top-rung
    spec with the next rung's share, once with the first seed, or at the last rung once per seed of the sweep."""
    rungs = halving_rungs(runs, finals)
    if not rungs or not rungs[-1].ended:
        return []
    top = rungs[-1]
    first = next(iter(top.runs.values()))[0]
    halving, _ = halving_of(first)
    if top.number >= halving.rungs - 1:
        return []
    kept = sweep.promoted(top.values, halving.reduction_factor)
    number = top.number + 1
    last = number == halving.rungs - 1
    specs = []
    for label in top.runs:  # grid order
        if label not in kept:
            continue
        base = min(top.runs[label], key=lambda r: r["id"])["config"]
        tag = base["study"]
        for seed in tag.get("seed_list") or [tag["seed"]] if last else [tag["seed"]]:
            spec = copy.deepcopy(base)
            spec["config"]["seed"] = seed
            stem = spec["name"].rsplit("-r", 1)[0]
            spec["name"] = f"{stem}-r{number}" + (f"-s{seed}" if last and len(tag.get("seed_list") or []) > 1 else "")
            spec["study"] = {**tag, "rung": number, "seed": seed}
            specs.append(spec)
    return specs


def _one_step_grid(runs: list[dict[str, Any]], eval_points: int) -> None:
    """Every run that does not set its own `eval_steps` evaluates every k steps, k from the longest run's steps:
    the points' curves are read at the same steps. A run on a budget's grid (`eval_every_seconds`, `eval_every_flops`:
    a sweep at equal time or compute) keeps it: a grid of steps beside it would read runs of different batch sizes at
    different times."""
    steps = [planned_steps(r) for r in runs]
    if not runs or any(s is None for s in steps):
        return
    every = max(1, math.ceil(max(steps) / eval_points))
    for run in runs:
        config = run.setdefault("config", {})
        if not config.get("eval_steps") and not config.get("eval_every_seconds") and not config.get("eval_every_flops"):
            config["eval_steps"] = every


def shared_stage_one(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """What one stage 1 per V* set saves: {"value_sets": distinct sets, "a2po_runs": A*-PO runs, "saved_runs": runs
    that start from stored rows}. Needs `RunSpec`-complete specs (the gate's)."""
    from a2po.runspec import RunSpec

    a2po = [s for s in specs if s.get("method", "a2po") == "a2po"]
    sets = {RunSpec.from_dict(s).value_fingerprint() for s in a2po}
    return {"value_sets": len(sets), "a2po_runs": len(a2po), "saved_runs": len(a2po) - len(sets)}


def grid_from_text(text: str) -> dict[str, str]:
    """The Launch page's grid box: one setting per line, "beta2: 0.001, 0.01" (or "beta2 = 0.001 0.01"); blank
    lines and lines starting with # are skipped. Values stay text (`parse_grid` reads them by the field's type)."""
    grid: dict[str, str] = {}
    for number, line in enumerate((text or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, values = line.replace("=", ":", 1).partition(":")
        if not sep or not name.strip() or not values.strip():
            raise StudyError(f"grid line {number} ({line[:40]!r}): write a setting, a colon and its values, e.g. "
                             "beta2: 0.001, 0.01")
        if name.strip() in grid:
            raise StudyError(f"grid line {number}: {name.strip()} is on two lines; put all its values on one.")
        grid[name.strip()] = values
    return grid


def _sequences_per_step(spec: dict[str, Any]) -> float:
    """Sequences an optimizer step trains on: A*-PO's batch counts prompts (one completion each), GRPO's counts
    completions."""
    config = spec.get("config") or {}
    return float(config.get("per_device_train_batch_size") or 8) * float(config.get("gradient_accumulation_steps") or 1)


def _rates(history: list[tuple[dict[str, Any], dict[str, float]]]) -> dict[tuple[str, str], dict[str, float]]:
    """Seconds per trained sequence and per stage-1 sample, by (model, method), medians over finished runs' clocks."""
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for spec, clock in history:
        key = (str(spec.get("model")), spec.get("method", "a2po"))
        rates = found.setdefault(key, {"train": [], "stage1": []})
        steps = clock.get("step")
        if steps and clock.get("train_seconds"):
            rates["train"].append(clock["train_seconds"] / (steps * _sequences_per_step(spec)))
        prompts = (spec.get("dataset") or {}).get("num_prompts")
        n = (spec.get("config") or {}).get("num_value_samples") or 8
        if key[1] == "a2po" and prompts and clock.get("values/train/runtime", 0) > 1:
            rates["stage1"].append(clock["values/train/runtime"] / (prompts * n))
    return {key: {name: sorted(v)[len(v) // 2] for name, v in rates.items() if v} for key, rates in found.items()}


def estimate_seconds(specs: list[dict[str, Any]], history: list[tuple[dict[str, Any], dict[str, float]]]
                     ) -> float | None:
    """Training time of a study's runs, one after another (stage 1 once per V* set, then each run's steps; held-out
    evaluations and loading not included), from the rates of finished runs of the same model and method in
    `history` ([(spec, clock)], clocks as `Store.run_clocks` gives them). None when some run has nothing to go by."""
    rates = _rates(history)
    total, sampled = 0.0, set()
    for spec in specs:
        method = spec.get("method", "a2po")
        rate = rates.get((str(spec.get("model")), method), {})
        steps = planned_steps(spec)
        if "train" not in rate or steps is None:
            return None
        total += steps * _sequences_per_step(spec) * rate["train"]
        if method == "a2po":
            from a2po.runspec import RunSpec

            fingerprint = RunSpec.from_dict(spec).value_fingerprint()
            if fingerprint not in sampled:
                if "stage1" not in rate:
                    return None
                sampled.add(fingerprint)
                prompts = (spec.get("dataset") or {}).get("num_prompts") or 0
                total += prompts * ((spec.get("config") or {}).get("num_value_samples") or 8) * rate["stage1"]
    return total
