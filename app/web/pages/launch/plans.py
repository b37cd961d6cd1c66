"""What the Launch form would start before it does: a pair's runs, steps and time per method, a sweep's runs and
time, an optimizer step's batch; and the handlers that show them."""

from __future__ import annotations

from typing import Any

import gradio as gr

from a2po.batches import spec_batch_figures
from a2po.compute import format_flops
from app.access import allowlist
from app.access.gate import Services
from app.studies import sweeps
from app.studies.protocols import (
    BUDGETED,
    MEASURED_DUELS,
    PROTOCOLS,
    StudyError,
    budget_flops,
    budget_seconds,
    parse_seeds,
    planned_steps,
    study_specs,
)
from app.web import forms
from app.web.common import format_duration
from app.web.pages.launch.form import LaunchForm, validate

DEFAULT_BUDGET_MINUTES = 10.0  # a budgeted pair's budgets where its preset has no measured duel
DEFAULT_BUDGET_FLOPS = 1e15
MATCHED = "Empty: the A*-PO run's."
MEASURED = "This preset's measured best for GRPO (docs/benchmarks.md, the recipe search)."
PAIR_NOTE = ("**A*-PO vs GRPO** launches the form's A*-PO run and a GRPO run matched to it: the same model, prompts, "
             "held-out set, rewards, learning rate and schedule, completion length; G = N; the same prompts per "
             "optimizer step (GRPO's batch counts completions: G × the A*-PO batch). Under equal time or compute GRPO "
             "may take its own learning rate and prompts per step (each method at its best point: for the teaching "
             "demo, GRPO's best in the recipe search is filled in). Both are evaluated on one grid. "
             "**Run seeds** (e.g. `0, 1, 2`) launch one run, or one pair, per seed as a study: Compare then shows each "
             "seed and their median.")
SWEEP_NOTE = ("One run per grid point and run seed (the seeds box above), as one study; A*-PO runs whose stage-1 "
              "settings match (everything but beta1, beta2, the learning rate, the filter, the epochs...) share one "
              "V* set, sampled once. `method: a2po, grpo` adds each point's GRPO match (the paper's protocol).")


def sweep_fields() -> list[tuple[str, str]]:
    """The settings a sweep may vary: the form's (`allowlist.PARAMS`), and the method."""
    return [("Method (a2po, grpo)", "method"), *((f"{p.label} ({p.key})", p.key) for p in allowlist.PARAMS
                                                 if p.key != "seed")]


def protocol_note(protocol: str) -> str:
    """The protocol's line under the pair's controls (`PROTOCOLS`)."""
    return f"**Protocol:** {PROTOCOLS.get(protocol, '')}"


def finished_history(services: Services) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """(spec, clock) of this studio's latest finished runs: what time estimates go by."""
    store = services.store
    finished = store.list_runs(status="finished")[:200]
    clocks = store.run_clocks(r["id"] for r in finished)
    return [(r["config"], clocks[r["id"]]) for r in finished if r["id"] in clocks]


def sweep_plan_text(services: Services, specs: list[dict[str, Any]]) -> str:
    """The sweep's size and, from this studio's finished runs, an estimate of its training time."""
    seconds = sweeps.estimate_seconds(specs, finished_history(services))
    tag = specs[0]["study"]
    points = len({repr(sorted(s["study"]["point"].items())) + s.get("method", "a2po") for s in specs})
    shared = sweeps.shared_stage_one(specs)
    estimate = (f"about {format_duration(seconds)} of training one after another (stage 1 and steps, from this "
                "studio's finished runs; evaluations and loading add to it)" if seconds is not None else
                "no estimate yet: this studio has no finished run of this model and method to measure from")
    return (f"**{len(specs)} runs**: {points} grid point(s) x {tag['seeds']} seed(s); stage 1 sampled for "
            f"{shared['value_sets']} V* set(s) and read by {shared['saved_runs']} other run(s); {estimate}.")


def pair_plan_text(spec: dict[str, Any], protocol: str, seeds: Any, budget_minutes: float | None,
                   history: list[tuple[dict[str, Any], dict[str, float]]], grpo_recipe: str | None = None,
                   flops: float | None = None, grpo_settings: dict[str, Any] | None = None) -> str:
    """What "A*-PO vs GRPO" would start from the A*-PO `spec`: its runs, their optimizer steps and evaluations, and
    each method's training time estimated from finished runs (`history`, as `finished_history` gives it); the GRPO
    side's recipe (`grpo_recipe`) first, when it has one; each side's learning rate when GRPO has its own
    (`grpo_settings`)."""
    try:
        specs = study_specs(spec, parse_seeds(seeds), pair=True, protocol=protocol,
                            budget_seconds=budget_seconds(budget_minutes), grpo_recipe=grpo_recipe,
                            budget_flops=budget_flops(flops), grpo_settings=grpo_settings)
    except StudyError as exc:
        return f"⚠ {exc}"
    per_step = pair_batch_text(specs[0], specs[1])
    if grpo_settings and "learning_rate" in grpo_settings:
        per_step += (f" **Learning rate:** A*-PO {specs[0]['config']['learning_rate']:g}, GRPO "
                     f"{specs[1]['config']['learning_rate']:g}.")
    if grpo_recipe:
        note = forms.recipe_note(specs[1]["recipe"], {**specs[1]["config"], "rewards": specs[1]["rewards"]})
        return (f"{note.replace('**Recipe:**', '**GRPO side:**', 1)}\n\n{_pair_runs_text(specs, protocol, history)}"
                f"\n\n{per_step}")
    return f"{_pair_runs_text(specs, protocol, history)}\n\n{per_step}"


def pair_batch_text(a2po: dict[str, Any], grpo: dict[str, Any]) -> str:
    """Each side's optimizer step (`a2po.batches`): the same prompts, one completion each against G."""
    return (f"**Per optimizer step:** A*-PO {spec_batch_figures(a2po).text()}; GRPO "
            f"{spec_batch_figures(grpo).text()}.")


def _pair_runs_text(specs: list[dict[str, Any]], protocol: str,
                    history: list[tuple[dict[str, Any], dict[str, float]]]) -> str:
    """The runs of a pair study (`study_specs`), their steps, evaluations and estimated training times."""
    a2po, grpo = specs[0], specs[1]
    count = len(specs) // 2
    runs = f"**This pair:** {len(specs)} runs ({count} seed{'s' if count > 1 else ''} x A*-PO and GRPO), one after " \
           "another"
    if protocol == "time":
        budget = a2po["config"]["max_train_seconds"]
        return (f"{runs}, each stopped after {format_duration(budget)} of training (A*-PO's stage 1 included): about "
                f"{format_duration(budget * len(specs))} in all, plus evaluations and loading.")
    if protocol == "compute":
        return (f"{runs}, each stopped once it has computed {format_flops(a2po['config']['max_train_flops'])} "
                "(A*-PO's stage 1 included; FLOPs counted from the tokens each run processes, docs/compute.md), "
                "whatever the machine or its load.")
    steps = planned_steps(a2po)
    if steps is None:
        return f"{runs}; their length is known once the dataset is loaded (a whole file), so no estimate yet."
    every = a2po["config"].get("eval_steps")
    held_out = (a2po.get("dataset") or {}).get("eval_size", 64)
    evaluations = (f"; {1 + steps // int(every)} evaluations of {held_out} held-out prompts each"
                   if isinstance(every, (int, float)) and every >= 1 else "")
    times = []
    for label, method_spec, extra in [("A*-PO", a2po, " (stage 1 included)"), ("GRPO", grpo, "")]:
        seconds = sweeps.estimate_seconds([method_spec], history)
        times.append(f"{label} about {format_duration(seconds)}{extra}" if seconds is not None else
                     f"{label}: no estimate yet (no finished {label} run of this model on this studio)")
    total = sweeps.estimate_seconds(specs, history) if count > 1 else None
    in_all = f" All {len(specs)} runs: about {format_duration(total)}." if total is not None else ""
    return (f"{runs}: {steps} optimizer steps each{evaluations}. Training time per seed, from this studio's finished "
            f"runs: {'; '.join(times)}; evaluations and loading add to it.{in_all}")


def batch_text(spec: dict[str, Any]) -> str:
    """What one optimizer step of the form's run trains on (`a2po.batches`), under the batch settings."""
    figures = spec_batch_figures(spec)
    if figures is None:
        return "**Per optimizer step:** set the batch size, accumulation steps and G to whole numbers to see it."
    note = " (GRPO's batch size counts completions, as TRL's)" if figures.method == "grpo" else ""
    return f"**Per optimizer step:** {figures.text()}{note}."


def pair_recipe(form: LaunchForm, data: dict[Any, Any]) -> str | None:
    """The GRPO side's recipe chosen for "A*-PO vs GRPO" (None: TRL's GRPOConfig defaults)."""
    name = data.get(form.pair_recipe)
    return None if name in (None, "", forms.NO_RECIPE) else name


def pair_grpo_settings(form: LaunchForm, data: dict[Any, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
    """GRPO's own learning rate and batch in "A*-PO vs GRPO" under equal time or compute, from the page's two
    fields (its batch: G x the prompts per step given, G = the A*-PO `spec`'s N); None where both are empty (or 0,
    what the browser sends for an empty number) or the protocol matches them to the A*-PO run. `StudyError` for a
    value that is not one."""
    if data[form.protocol] not in BUDGETED:
        return None
    settings: dict[str, Any] = {}
    rate, prompts = data.get(form.pair_grpo_lr), data.get(form.pair_grpo_prompts)
    if rate not in (None, "", 0):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
            raise StudyError(f"GRPO's learning rate: give a number between 0 and 1, e.g. 3e-5, or leave it empty for "
                             f"the A*-PO run's (got {rate!r}).")
        settings["learning_rate"] = float(rate)
    if prompts not in (None, "", 0):
        if isinstance(prompts, bool) or not isinstance(prompts, (int, float)) or prompts < 1 or prompts != int(prompts):
            raise StudyError(f"GRPO's prompts per step: give a whole number >= 1, e.g. 16, or leave it empty for the "
                             f"A*-PO run's (got {prompts!r}).")
        group = int((spec.get("config") or {}).get("num_value_samples") or 8)
        settings["per_device_train_batch_size"] = group * int(prompts)
    return settings or None


def pair_defaults(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """What a picked protocol or preset sets in "A*-PO vs GRPO": under equal time or compute, the preset's measured
    duel where it has one (`MEASURED_DUELS`: the budgets measured and GRPO's best recipe, learning rate and prompts
    per step at them); otherwise TRL's GRPO matched to the A*-PO run, and the budgets' general defaults."""
    measured = MEASURED_DUELS.get(data[form.preset]) if data[form.protocol] in BUDGETED else None
    if measured is None:
        return {form.pair_recipe: forms.NO_RECIPE, form.pair_grpo_lr: gr.update(value=None, info=MATCHED),
                form.pair_grpo_prompts: gr.update(value=None, info=f"{MATCHED} Its batch is G × this."),
                form.budget: DEFAULT_BUDGET_MINUTES, form.flops_budget: DEFAULT_BUDGET_FLOPS}
    return {form.pair_recipe: measured.grpo_recipe,
            form.pair_grpo_lr: gr.update(value=measured.grpo_learning_rate, info=f"{MEASURED} {MATCHED}"),
            form.pair_grpo_prompts: gr.update(value=measured.grpo_prompts_per_step,
                                              info=f"{MEASURED} Its batch is G × this."),
            form.budget: measured.budget_minutes, form.flops_budget: measured.budget_flops}


def plan_pair(form: LaunchForm, data: dict[Any, Any]) -> str:
    """The pair the form would start (`pair_plan_text`): runs, steps, evaluations, time per method."""
    result = validate(form.services, form.values(data, action="train", method="a2po"))
    if not result.ok:
        return f"⚠ Fix the form first to see the pair's plan: {len(result.errors)} problem(s) (marked)."
    try:
        own = pair_grpo_settings(form, data, result.spec)
    except StudyError as exc:
        return f"⚠ {exc}"
    return pair_plan_text(result.spec, data[form.protocol], data[form.seeds], data[form.budget],
                          finished_history(form.services), grpo_recipe=pair_recipe(form, data),
                          flops=data[form.flops_budget], grpo_settings=own)


def show_batch(form: LaunchForm, data: dict[Any, Any]) -> str:
    """`batch_text` of the form's values, as they are (unchecked)."""
    return batch_text(forms.form_to_spec(form.values(data)))


def show_protocol(form: LaunchForm, protocol: str) -> dict[Any, Any]:
    """The protocol's note; the time budget only for equal time, the FLOPs budget only for equal compute, GRPO's own
    learning rate and prompts per step only under either."""
    return {form.budget: gr.update(visible=protocol == "time"),
            form.flops_budget: gr.update(visible=protocol == "compute"),
            form.pair_grpo_lr: gr.update(visible=protocol in BUDGETED),
            form.pair_grpo_prompts: gr.update(visible=protocol in BUDGETED),
            form.protocol_text: protocol_note(protocol)}


def plan_sweep(form: LaunchForm, data: dict[Any, Any]) -> str:
    """How many runs the grid and seeds make, and an estimate of their training time."""
    if not (data[form.sweep_grid] or "").strip():
        return SWEEP_NOTE
    result = validate(form.services, form.values(data, action="train"))
    if not result.ok:
        return f"⚠ Fix the form first: {len(result.errors)} problem(s) (see the marked fields)."
    halving = sweeps.parse_halving(True) if data.get(form.sweep_halving) else None
    try:
        seeds = parse_seeds(data[form.seeds])
        specs = sweeps.sweep_specs(result.spec, sweeps.grid_from_text(data[form.sweep_grid]), seeds, halving=halving)
    except StudyError as exc:
        return f"⚠ {exc}"
    if halving is None:
        return sweep_plan_text(form.services, specs)
    shares = ", ".join(f"{halving.share(r):.3g}" for r in range(halving.rungs))
    return (f"**Halving:** {len(specs)} points at rung 0 with the first seed; the best 1/{halving.reduction_factor} "
            f"go on at each rung, on {shares} of the budget's training part; the last rung with every seed: at most "
            f"{halving.max_runs(len(specs), len(seeds) or 1)} runs. The studio launches each rung when the one "
            "before has ended (docs/studies.md).")


def add_sweep_field(form: LaunchForm, data: dict[Any, Any]) -> dict[Any, Any]:
    """A grid line for the picked setting, starting from its value on the form."""
    name, grid = data[form.sweep_field], data[form.sweep_grid]
    if not name:
        return {form.sweep_grid: gr.skip(), form.sweep_field: gr.skip()}
    current = data[form.inputs[name]] if name in form.inputs else ""
    line = f"{name}: {'' if current is None else current}, "
    return {form.sweep_grid: grid.rstrip() + "\n" + line if grid and grid.strip() else line, form.sweep_field: None}
