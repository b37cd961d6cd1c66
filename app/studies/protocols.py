"""How a study's runs are made from one spec: "A*-PO vs GRPO" under a protocol, and run seeds.

Protocols of "A*-PO vs GRPO" (`pair_specs`), each stated on the Launch and Compare pages (`PROTOCOLS`):

    paper   The paper's (the default): both methods train over every prompt (A*-PO with `filter_all_incorrect` off,
            as the authors' scripts run it), the same prompts per optimizer step and the same number of steps, with
            the same learning rate and schedule; G = N. A*-PO samples one completion per prompt per step, GRPO G.
    trl     TRL's defaults: A*-PO drops the prompts no reference sample solved (`filter_all_incorrect` on, TRL's
            default) and makes its passes over those it kept, so it takes fewer steps than GRPO over all of them.
    time    Equal time: both runs train until the same budget of training time is spent (A*-PO's stage 1 inside
            its budget; `max_train_seconds`), with epochs enough to fill it. A*-PO's V* set reused from an earlier
            run (a second duel, a shared `values_seed`, a sweep) is charged what sampling it cost
            (`app.runtime.value_sets.charge_reused_values`): stage 1 is never free.
    compute Equal compute: as equal time, with a budget of FLOPs counted from the tokens each run processes
            (`max_train_flops`, `a2po.compute`, docs/compute.md) instead of seconds: the same on every machine and
            whatever else the machine runs, so a seeded pair gives the same answer anywhere.

Both runs of a pair are evaluated on one absolute grid: every k optimizer steps (k from the steps planned over
every prompt, `EVAL_POINTS` points), or every t seconds of training under equal time, so "reached X at step k" has
the same resolution for both. The GRPO side runs TRL's GRPOConfig defaults, or a named recipe (`grpo_recipe`:
DAPO, Dr. GRPO, GSPO, ... from `a2po.recipes`). Seeds (`seeded`): one run per seed, the dataset unchanged (the same
prompts and held-out set), the run seed (stage-1 samples, training order and samples) set to each.
"""

from __future__ import annotations

import copy
import math
import uuid
from dataclasses import dataclass
from typing import Any

from a2po.recipes import RecipeError, canonical_name, recipe_settings
from a2po.shown import shown

PROTOCOLS = {
    "paper": "The paper's protocol: both methods over every prompt (A*-PO with filter_all_incorrect off, as the "
             "authors' scripts run it), the same prompts per optimizer step, the same number of steps, learning rate "
             "and schedule, G = N; held-out accuracy on one grid of steps.",
    "trl": "TRL's defaults: A*-PO drops the prompts none of its N reference samples solved (filter_all_incorrect on) "
           "and trains over those it keeps, so it takes fewer steps than GRPO over every prompt; one grid of steps.",
    "time": "Equal time: both runs train until the same training-time budget is spent (A*-PO's stage 1 counted "
            "inside its budget, also when its V* set was sampled by an earlier run: that run's sampling time is "
            "charged), the same prompts per step, held-out accuracy every 1/8 of the budget.",
    "compute": "Equal compute: both runs train until the same budget of FLOPs is spent, counted from the tokens each "
               "processes (2 x parameters per token sampled or scored, 6 x parameters per token trained; A*-PO's "
               "stage 1 inside its budget, a reused V* set charged its share), so the answer is the same on any "
               "machine; held-out accuracy every 1/8 of the budget.",
}
PROTOCOL_LABELS = {"paper": "The paper's (same steps, every prompt)", "trl": "TRL's defaults (filter on)",
                   "time": "Equal time (a budget)", "compute": "Equal compute (a FLOPs budget, any machine)"}
BUDGETED = ("time", "compute")  # the protocols that give each run a budget rather than steps
DEFAULT_PROTOCOL = "paper"
EVAL_POINTS = 8  # held-out evaluations after the step-0 one, when the spec asks for no other grid
TIME_EPOCHS = 20.0  # equal time: passes enough for the budget to end the runs, not their epochs
MAX_SEEDS = 10
# What the GRPO side of an equal-time pair may set for itself (`pair_specs`'s `grpo_settings`); its batch counts
# completions, G per prompt.
GRPO_OWN_SETTINGS = ("learning_rate", "per_device_train_batch_size")


@dataclass(frozen=True)
class MeasuredDuel:
    """A preset's "A*-PO vs GRPO" at equal time or compute as measured (docs/benchmarks.md, "The recipe search at
    equal compute, halved"): the budgets of the measured duels and GRPO's best point at them. The Launch page starts
    a budgeted pair of that preset from these, the A*-PO side from the preset itself."""

    grpo_recipe: str
    grpo_learning_rate: float
    grpo_prompts_per_step: int
    budget_flops: float
    budget_minutes: float


# GRPO's best point for the teaching task in the recipe search (4e13 FLOPs a run, run seeds 0-2, median final
# held-out accuracy); the A*-PO side is the preset's own recipe, its best point there.
MEASURED_DUELS = {"teaching-demo": MeasuredDuel(grpo_recipe="dapo", grpo_learning_rate=3e-5, grpo_prompts_per_step=16,
                                                budget_flops=4e13, budget_minutes=4.0)}

# Settings both methods have, copied from the A*-PO run to its GRPO match (same names in A2POConfig and GRPOConfig).
SHARED_SETTINGS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "max_steps",
                   "num_train_epochs", "max_completion_length", "max_prompt_length", "temperature", "top_p", "top_k",
                   "seed", "per_device_eval_batch_size", "logging_steps", "eval_steps", "save_steps",
                   "save_every_seconds", "gradient_accumulation_steps", "gradient_checkpointing", "use_cpu",
                   "max_train_seconds", "eval_every_seconds", "max_train_flops", "eval_every_flops")


class StudyError(ValueError):
    """A study that cannot be made from what was given; the message names the setting and the fix."""


def parse_seeds(value: Any) -> list[int]:
    """Run seeds from a list or text ("0, 1, 2" or "0 1 2"); None or empty: []. Each a whole number >= 0, unique."""
    if value is None or value == "" or value == []:
        return []
    items = value.replace(",", " ").split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise StudyError(f"seeds: give a list of whole numbers, e.g. [0, 1, 2] (got {shown(value)}).")
    if len(items) > MAX_SEEDS:
        raise StudyError(f"seeds: at most {MAX_SEEDS} per study (got {len(items)}).")
    from a2po.config import MAX_SEED, whole_number  # torch: loaded when a study is made, not with the pages

    seeds = []
    for item in items:
        seed = whole_number(item)  # None for a bool: JSON's true is not the seed 1
        if seed is None or not 0 <= seed <= MAX_SEED:
            raise StudyError(f"seeds: {shown(item)} is not a whole number from 0 to {MAX_SEED}; give e.g. 0, 1, 2.")
        seeds.append(seed)
    if len(set(seeds)) != len(seeds):
        raise StudyError(f"seeds: each seed once (got {', '.join(map(str, seeds))}).")
    return seeds


def budget_seconds(minutes: Any) -> float | None:
    """The equal-time budget `budget_minutes` in seconds; None when none is given (None, "" or 0)."""
    if minutes is None or minutes == "" or (minutes == 0 and not isinstance(minutes, bool)):
        return None
    from a2po.config import real_number

    number = real_number(minutes)
    if number is None or number <= 0 or not math.isfinite(number * 60):
        raise StudyError(f"budget_minutes: give each run's training time as a number of minutes > 0, e.g. 10 "
                         f"(got {shown(minutes)}).")
    return number * 60


def budget_flops(flops: Any) -> float | None:
    """The equal-compute budget `budget_flops` in FLOPs; None when none is given (None, "" or 0)."""
    if flops is None or flops == "" or (flops == 0 and not isinstance(flops, bool)):
        return None
    from a2po.config import real_number

    number = real_number(flops)
    if number is None or number <= 0:
        raise StudyError(f"budget_flops: give each run's compute as a number of FLOPs > 0, e.g. 2e15 (got "
                         f"{shown(flops)}).")
    return number


def planned_steps(spec: dict[str, Any]) -> int | None:
    """Optimizer steps of a run over every train prompt of its dataset (None when the dataset's size is unknown
    before loading it, e.g. a whole file)."""
    config, dataset = spec.get("config") or {}, spec.get("dataset") or {}
    max_steps = config.get("max_steps")
    if isinstance(max_steps, (int, float)) and max_steps > 0:
        return int(max_steps)
    prompts = dataset.get("num_prompts")
    if not isinstance(prompts, (int, float)) or prompts <= 0:
        return None
    batch = int(config.get("per_device_train_batch_size") or 8)
    if spec.get("method") == "grpo":  # GRPO's batch counts completions, G of each prompt
        batch = max(1, batch // int(config.get("num_generations") or 8))
    accumulation = int(config.get("gradient_accumulation_steps") or 1)
    processes = int(spec.get("num_processes") or 1)
    # As the Trainer counts: batches per process in an epoch, then optimizer steps.
    per_epoch = math.ceil(math.ceil(prompts / (batch * processes)) / accumulation)
    return max(1, math.ceil(float(config.get("num_train_epochs") or 3.0) * per_epoch))


def _step_grid(spec: dict[str, Any], points: int) -> float:
    """`eval_steps` for a grid of `points` evaluations: a whole k when the steps are known, else a fraction of each
    run's own steps (the same k for runs of equal length)."""
    given = (spec.get("config") or {}).get("eval_steps")
    if isinstance(given, (int, float)) and given >= 1:
        return int(given)
    steps = planned_steps(spec)
    if isinstance(given, (int, float)) and 0 < given < 1:
        return max(1, round(given * steps)) if steps else given
    return max(1, math.ceil(steps / points)) if steps else 1 / points


def require_a2po(spec: Any) -> None:
    """`StudyError` unless `spec` is an A*-PO spec: a pair is made from the A*-PO run's spec."""
    if isinstance(spec, dict) and spec.get("method", "a2po") != "a2po":
        raise StudyError(f"A*-PO vs GRPO starts from an A*-PO spec, and this one's method is {spec['method']!r}: "
                         "send the A*-PO run's spec (no \"method\", or \"method\": \"a2po\"); its GRPO match is "
                         "made from it.")


def pair_specs(spec: dict[str, Any], protocol: str = DEFAULT_PROTOCOL, budget_seconds: float | None = None,
               eval_points: int = EVAL_POINTS, grpo_recipe: str | None = None,
               grpo_settings: dict[str, Any] | None = None, budget_flops: float | None = None
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """An A*-PO spec (checked, every setting stated) and the GRPO spec matched to it under `protocol`.

    Matched in every protocol: the same model, dataset (prompts and held-out set), rewards, LoRA, processes and every
    setting both methods have (learning rate and schedule, epochs or max steps, completion and prompt lengths,
    sampling, seed); GRPO's G = A*-PO's N; the same prompts per optimizer step: GRPO's per_device_train_batch_size,
    which counts completions, is G x A*-PO's (which counts prompts). GRPO's own settings (beta, loss_type, epsilon,
    ...) keep TRL's defaults, or are those of `grpo_recipe` (`a2po.recipes`: settings only GRPO has, so the match
    holds). Under equal time or compute (`budget_seconds`, `budget_flops`), `grpo_settings` may give the GRPO side its
    own `GRPO_OWN_SETTINGS` (each method at its best point: the budget, not the steps, is what the pair shares). See
    the module docstring for what each protocol changes."""
    if protocol not in PROTOCOLS:
        raise StudyError(f"protocol must be one of {', '.join(PROTOCOLS)} (got {shown(protocol)}).")
    _check_grpo_settings(grpo_settings, protocol)
    require_a2po(spec)
    if spec.get("action", "train") != "train":
        raise StudyError("A*-PO vs GRPO compares two training runs: set the action to \"train\".")
    a2po = copy.deepcopy(spec)
    config = a2po.setdefault("config", {})
    n = int(config.get("num_value_samples") or 8)
    if n < 2:
        raise StudyError(f"A*-PO vs GRPO needs N (num_value_samples) >= 2: GRPO's G = N compares the completions of "
                         f"a group, and one completion has nothing to compare with (N is {n}).")
    if not (a2po.get("dataset") or {}).get("eval_size", 64):
        raise StudyError("A*-PO vs GRPO compares held-out accuracy: set the dataset's eval_size (held-out prompts) "
                         "above 0.")
    unbudgeted = dict(max_train_seconds=None, eval_every_seconds=None, max_train_flops=None, eval_every_flops=None)
    if protocol in BUDGETED:
        given = budget_seconds if protocol == "time" else budget_flops
        if not isinstance(given, (int, float)) or given <= 0:
            raise StudyError("The equal-time protocol needs a budget: budget_minutes > 0 (each run's training time, "
                             "A*-PO's stage 1 included)." if protocol == "time" else
                             "The equal-compute protocol needs a budget: budget_flops > 0 (each run's compute in "
                             "FLOPs, A*-PO's stage 1 included), e.g. 2e15.")
        unit = "seconds" if protocol == "time" else "flops"
        config.update(unbudgeted, eval_steps=None, max_steps=-1,
                      num_train_epochs=max(float(config.get("num_train_epochs") or 0), TIME_EPOCHS),
                      **{f"max_train_{unit}": float(given), f"eval_every_{unit}": float(given) / eval_points})
    else:
        config.update(unbudgeted, eval_steps=_step_grid(a2po, eval_points))
    config["filter_all_incorrect"] = protocol == "trl"
    base = str(a2po.get("name") or "pair")[:80]
    a2po["name"] = f"{base}-a2po"
    grpo = {k: copy.deepcopy(v) for k, v in a2po.items() if k != "config"}
    grpo.update(name=f"{base}-grpo", method="grpo")
    grpo["config"] = {k: config[k] for k in SHARED_SETTINGS if k in config}
    grpo["config"].update(num_generations=n, per_device_train_batch_size=n * int(config["per_device_train_batch_size"]))
    if grpo_recipe:
        grpo["recipe"] = recipe_name(grpo_recipe)
        grpo["config"].update(recipe_settings(grpo["recipe"]))
    grpo["config"].update(grpo_settings or {})
    return a2po, grpo


def _check_grpo_settings(settings: Any, protocol: str) -> None:
    """`StudyError` unless `settings` is empty, or a mapping of `GRPO_OWN_SETTINGS` under the equal-time protocol."""
    if not settings:
        return
    if not isinstance(settings, dict):
        raise StudyError(f"grpo_settings: give a mapping, e.g. {{\"learning_rate\": 3e-5}} (got {shown(settings)}).")
    if protocol not in BUDGETED:
        raise StudyError(f"grpo_settings: the {protocol} protocol matches GRPO's learning rate and prompts per step to "
                         "A*-PO's; give GRPO its own only under equal time or compute (protocol \"time\" or "
                         "\"compute\").")
    if other := [k for k in settings if k not in GRPO_OWN_SETTINGS]:
        raise StudyError(f"grpo_settings: {shown(other[0])} is matched to the A*-PO run; the GRPO side may set only "
                         f"{', '.join(GRPO_OWN_SETTINGS)}.")


def recipe_name(name: str) -> str:
    """A GRPO recipe's name as `a2po.recipes` spells it; `StudyError` naming the recipes for an unknown one."""
    try:
        return canonical_name(name)
    except RecipeError as error:
        raise StudyError(f"grpo_recipe: {error}") from None


def study_specs(spec: dict[str, Any], seeds: list[int], *, pair: bool, protocol: str = DEFAULT_PROTOCOL,
                budget_seconds: float | None = None, eval_points: int = EVAL_POINTS,
                study_id: str | None = None, grpo_recipe: str | None = None,
                grpo_settings: dict[str, Any] | None = None, budget_flops: float | None = None
                ) -> list[dict[str, Any]]:
    """Every run of a study, tagged with it: the pair (`pair`, its GRPO side under `grpo_recipe` and
    `grpo_settings`) or the spec alone, once per seed (none given: the spec's own seed). A pair's runs come A*-PO
    first, then GRPO, seed by seed."""
    own_seed = int((spec.get("config") or {}).get("seed") or 0)
    seeds = seeds or [own_seed]
    sid = study_id or uuid.uuid4().hex[:10]
    base = str(spec.get("name") or "study")[:80]
    runs = []
    for seed in seeds:
        one = copy.deepcopy(spec)
        one.setdefault("config", {})["seed"] = seed
        made = list(pair_specs(one, protocol, budget_seconds, eval_points, grpo_recipe, grpo_settings,
                               budget_flops)) if pair else [one]
        for run in made:
            if len(seeds) > 1:
                run["name"] = f"{run.get('name') or base}-s{seed}"
            run["study"] = {"id": sid, "name": base, "kind": "pair" if pair else "seeds", "seed": seed,
                            "seeds": len(seeds), **({"protocol": protocol} if pair else {}),
                            **({"grpo_recipe": recipe_name(grpo_recipe)} if pair and grpo_recipe else {}),
                            **({"grpo_settings": dict(grpo_settings)} if pair and grpo_settings else {})}
        runs.extend(made)
    return runs
