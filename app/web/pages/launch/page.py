"""The Launch page: its layout, laid out once (`build_launch_page`: the sections of `sections` fill one
`LaunchForm`), and its events, each bound to a module-level handler of `actions` or `plans`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from a2po.names import ACTIONS
from app.access.gate import Services
from app.web import forms
from app.web.pages.launch.actions import (
    apply_preset,
    check,
    load_spec,
    load_yaml,
    match_rewards,
    pick_recipe,
    save_yaml,
    show_command,
    show_method,
    show_preview,
    show_recipe,
    start,
    start_pair,
    start_sweep,
    try_it,
)
from app.web.pages.launch.form import LaunchForm, reward_choices, show_source
from app.web.pages.launch.plans import (
    add_sweep_field,
    pair_defaults,
    plan_pair,
    plan_sweep,
    show_batch,
    show_protocol,
)
from app.web.pages.launch.sections import (
    actions_section,
    dataset_section,
    rewards_section,
    run_section,
    settings_section,
)


@dataclass
class LaunchPage:
    """Components other pages use: the id of the run this session launched last, the form's inputs."""

    launched: gr.State
    events: list[Any]
    model: gr.Dropdown
    inputs: dict[str, gr.components.Component] = field(default_factory=dict)
    preset: gr.Dropdown | None = None
    # What "Clone this run" fills: `load_spec(spec, verb)` returns updates for `fill_outputs`.
    fill_outputs: list[Any] = field(default_factory=list)
    load_spec: Any = None
    # "A*-PO vs GRPO": the ids [A*-PO's, GRPO's] of the pair this session launched last, and its event.
    pair: gr.State | None = None
    pair_event: Any = None
    # `plan_pair_on(triggers)`: refresh the pair's plan (runs, steps, time per method) on these events too.
    plan_pair_on: Any = None
    # "Launch sweep": the id of the study this session launched last, and its event.
    sweep_study: gr.State | None = None
    sweep_event: Any = None
    form: LaunchForm | None = None  # the page's components, which its handlers take


def build_launch_page(services: Services, token: gr.BrowserState | None = None) -> LaunchPage:
    """Lay out the launch form and wire presets, validation, preview, the command view and the three actions."""
    reward_info = reward_choices()
    form = LaunchForm(services=services, token=token if token is not None else gr.State(None),
                      defaults=forms.default_form(), reward_names=list(reward_info))
    gr.Markdown("## Launch a run\nThe teaching demo works offline: press **Train** to fine-tune the built-in "
                "model on arithmetic and watch stage 1 (V* estimation) and stage 2 (A*-PO training) live.")
    with gr.Row():
        with gr.Column(scale=3):
            run_section(form)
            dataset_section(form)
            rewards_section(form, reward_info)
            settings_section(form)
        with gr.Column(scale=2):
            actions_section(form)
    starts, pair_event, sweep_event = _wire_actions(form)
    _wire_form(form)
    return LaunchPage(launched=form.launched, events=starts, model=form.inputs["model"], inputs=form.inputs,
                      preset=form.preset, sweep_study=form.sweep_study, sweep_event=sweep_event,
                      fill_outputs=[*form.fields, *form.boxes, form.status],
                      load_spec=functools.partial(load_spec, form), pair=form.pair, pair_event=pair_event,
                      plan_pair_on=functools.partial(plan_pair_on, form), form=form)


PRIVATE = {"api_visibility": "private"}
# The fields the batch figures (`batch_text`) read.
BATCH_FIELDS = ("method", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                "num_value_samples", "num_processes", "pass_rate_band")
# The fields that change a pair's length; the rest are read when one of these, or the page, changes.
PAIR_LENGTH_FIELDS = ("model", "num_prompts", "eval_size", "num_train_epochs", "max_steps",
                      "per_device_train_batch_size", "gradient_accumulation_steps", "num_value_samples", "eval_steps")


def _bind(handler: Callable[..., Any], form: LaunchForm, *args: Any) -> Callable[..., Any]:
    """`handler(form, *args, ...)` as an event function, under the handler's name."""
    event = functools.partial(handler, form, *args)
    event.__name__ = handler.__name__
    return event


def _with_request(handler: Callable[..., Any], form: LaunchForm, *args: Any) -> Callable[..., Any]:
    """`handler(form, *args, data, request)` as an event function: Gradio hands the request (for the login) to a
    parameter annotated `gr.Request`."""
    def event(data: dict, request: gr.Request) -> dict[Any, Any]:
        return handler(form, *args, data, request)
    event.__name__ = handler.__name__
    return event


def _wire_actions(form: LaunchForm) -> tuple[list[Any], Any, Any]:
    """The buttons that start runs and the form's tools. Returns the events after which the Run page opens the run
    launched (one per action, then the pair's), the pair's event and the sweep's."""
    bind, buttons = _bind, form.buttons
    errors = list(form.errors.values())
    buttons["try"].click(_with_request(try_it, form), {form.token, *form.fields}, [form.try_verdict, form.try_table],
                         concurrency_limit=1, concurrency_id="playground", **PRIVATE)
    buttons["check"].click(bind(check, form), set(form.fields), [*errors, form.status], **PRIVATE)
    buttons["command"].click(bind(show_command, form), set(form.fields), [*errors, form.command], **PRIVATE)
    buttons["preview"].click(bind(show_preview, form), set(form.fields), [form.preview_info, form.preview],
                             **PRIVATE)
    events = [buttons[action].click(_with_request(start, form, action), {form.token, form.seeds, *form.fields},
                                    [*errors, form.status, form.launched], concurrency_limit=1, **PRIVATE)
              for action in ACTIONS]
    pair_event = buttons["pair"].click(_with_request(start_pair, form),
                                       {form.token, form.seeds, *form.pair_controls, *form.fields},
                                       [*errors, form.status, form.launched, form.pair], concurrency_limit=1,
                                       **PRIVATE)
    sweep_event = buttons["sweep"].click(_with_request(start_sweep, form),
                                         {form.token, form.seeds, form.sweep_grid, form.sweep_halving, *form.fields},
                                         [*errors, form.status, form.launched, form.sweep_study], concurrency_limit=1,
                                         **PRIVATE)
    buttons["save"].click(bind(save_yaml, form), set(form.fields), [*errors, form.status, form.saved], **PRIVATE)
    buttons["load"].upload(bind(load_yaml, form), buttons["load"], [*form.fields, *form.boxes, form.status],
                           **PRIVATE)
    return [*events, pair_event], pair_event, sweep_event


def plan_pair_on(form: LaunchForm, triggers: list[Any]) -> None:
    """Refresh the pair's plan (runs, steps, time per method) on these events."""
    gr.on(triggers, _bind(plan_pair, form), {form.seeds, *form.pair_controls, *form.fields},
          form.pair_plan, trigger_mode="always_last", **PRIVATE)


def _wire_form(form: LaunchForm) -> None:
    """What changes with the form's fields: the protocol's note, the plans of a pair and a sweep, the method's
    settings, the dataset's boxes and rewards, a preset."""
    bind, inputs = _bind, form.inputs
    form.protocol.change(bind(show_protocol, form), form.protocol, [form.budget, form.flops_budget, form.pair_grpo_lr,
                                                                     form.pair_grpo_prompts, form.protocol_text],
                         **PRIVATE)
    # `.input`: a user's pick of a protocol or preset sets the pair's defaults (a preset's measured duel), not a clone.
    gr.on([form.protocol.input, form.preset.input], bind(pair_defaults, form), {form.protocol, form.preset},
          [form.pair_recipe, form.pair_grpo_lr, form.pair_grpo_prompts, form.budget, form.flops_budget], **PRIVATE)
    plan_pair_on(form, [form.protocol.change, form.seeds.change,
                        *(control.change for control in form.pair_controls if control is not form.protocol),
                        *(inputs[k].change for k in PAIR_LENGTH_FIELDS if k in inputs)])
    gr.on([inputs[k].change for k in BATCH_FIELDS if k in inputs], bind(show_batch, form), set(form.fields),
          form.batch_text, trigger_mode="always_last", **PRIVATE)
    plan_inputs = {form.sweep_grid, form.seeds, form.sweep_halving, *form.fields}
    for box in (form.sweep_grid, form.seeds, form.sweep_halving):
        box.change(bind(plan_sweep, form), plan_inputs, form.sweep_plan, trigger_mode="always_last", **PRIVATE)
    form.sweep_field.input(bind(add_sweep_field, form), {form.sweep_field, form.sweep_grid, *form.fields},
                           [form.sweep_grid, form.sweep_field], **PRIVATE)
    inputs["method"].change(bind(show_method, form), inputs["method"],
                            [*form.param_columns.values(), form.recipe_box], **PRIVATE)
    # `.input`: a user's pick fills the recipe's settings; a preset, a loaded config or a clone keeps its own values.
    recipe_fields = [inputs[k] for k in forms.recipe_values(forms.NO_RECIPE) if k in inputs]
    inputs["recipe"].input(bind(pick_recipe, form), set(form.fields), recipe_fields, **PRIVATE)
    note_triggers = [inputs["recipe"].change, inputs["num_iterations"].change,
                     *(inputs[f"use_reward:{name}"].change for name in form.reward_names)]
    gr.on(note_triggers, bind(show_recipe, form), set(form.fields), form.recipe_text, trigger_mode="always_last",
          **PRIVATE)
    inputs["dataset_source"].change(bind(show_source, form), inputs["dataset_source"], form.boxes, **PRIVATE)
    # `.input`: only a user's pick switches the rewards, not a preset, a loaded config or a clone filling the form.
    inputs["dataset_source"].input(bind(match_rewards, form), inputs["dataset_source"],
                                   [inputs[f"use_reward:{name}"] for name in form.reward_names], **PRIVATE)
    form.preset.input(bind(apply_preset, form), form.preset, [*form.fields, *form.boxes, form.preset, form.status],
                      **PRIVATE)
