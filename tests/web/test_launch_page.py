"""The Launch page's handlers called directly, without a browser: the page is built once in a `gr.Blocks` on a real
SQLite file and a real (never started) scheduler; each handler gets an event's values ({component: value}) and is
checked by the updates it returns ({component: update}). The browser tests (tests/test_app_browser*.py) click the
same handlers through Chromium."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest

from app.access.gate import Services
from app.runtime.devices import Devices
from app.runtime.scheduler import Scheduler
from app.web.pages.launch.actions import (
    apply_preset,
    check,
    load_spec,
    match_rewards,
    save_yaml,
    show_command,
    show_method,
    start,
    start_pair,
)
from app.web.pages.launch.form import LaunchForm, show_source
from app.web.pages.launch.page import build_launch_page
from app.web.pages.launch.plans import SWEEP_NOTE, add_sweep_field, pair_defaults, plan_pair, plan_sweep, show_protocol
from storage import Store


@pytest.fixture(scope="module")
def form(tmp_path_factory) -> LaunchForm:
    data_dir = tmp_path_factory.mktemp("launch-page")
    store = Store(data_dir / "studio.db")
    jobs = Scheduler(store, data_dir, devices=Devices.parse("none"))  # never started: launched runs stay queued
    with gr.Blocks():
        page = build_launch_page(Services(store=store, scheduler=jobs, data_dir=data_dir))
    return page.form


def event(form: LaunchForm, **fields) -> dict:
    """What the browser sends for the form as it opens, with `fields` (by form key) changed."""
    data = {component: component.value for component in form.fields}
    data.update({form.inputs[key]: value for key, value in fields.items()})
    return {**data, form.token: None, form.seeds: "", form.protocol: "paper", form.budget: 10, form.flops_budget: 1e15,
            form.pair_recipe: "none", form.pair_grpo_lr: None, form.pair_grpo_prompts: None,
            form.preset: "teaching-demo", form.sweep_grid: "", form.sweep_field: None}


def shown_problems(form: LaunchForm, updates: dict) -> dict[str, str]:
    """The problems the updates show, by field."""
    return {key: updates[slot].value for key, slot in form.errors.items() if updates[slot].visible}


def runs(form: LaunchForm) -> list[dict]:
    return form.services.store.list_runs()


def test_a_valid_form_checks_and_starts_a_run(form):
    updates = check(form, event(form))
    assert updates[form.status] == "✅ The form is valid." and shown_problems(form, updates) == {}
    assert "python -m a2po train --model SmolLM2-135M-Instruct" in show_command(form, event(form))[form.command]
    before = len(runs(form))
    updates = start(form, "values", event(form, name="from-the-handler"), None)
    run_id = updates[form.launched]
    assert updates[form.status] == f"✅ Started run #{run_id} (Estimate V* only)."
    assert len(runs(form)) == before + 1
    run = form.services.store.get_run(run_id)
    assert run["name"] == "from-the-handler" and run["config"]["action"] == "values"


@pytest.mark.parametrize("source", ["arithmetic", "file"])
def test_one_train_click_builds_the_runs_config_once(form, monkeypatch, source):
    """The page asks the gate once per click and the scheduler queues the run the gate checked: one config
    (a TrainingArguments) is built in the studio's process, for a file dataset too, whose first row the page reads."""
    from a2po.config import _BaseConfig

    data = form.services.policy.datasets_dir / "qa.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    built, build = [], _BaseConfig.__post_init__

    def counted(config):
        built.append(type(config).__name__)
        build(config)

    monkeypatch.setattr(_BaseConfig, "__post_init__", counted)
    fields = {"dataset_source": "file", "file_path": str(data)} if source == "file" else {}
    updates = start(form, "train", event(form, name=f"once-{source}", **fields), None)
    run = form.services.store.get_run(updates[form.launched])
    assert run["name"] == f"once-{source}" and run["config"]["dataset"]["source"] == source
    assert built == ["A2POConfig"]


def test_problems_show_under_their_fields_and_start_nothing(form):
    limit = form.services.policy.limits.max_prompts
    updates = check(form, event(form, num_prompts=limit + 1, beta1=0))
    assert updates[form.status] == "❌ 2 problem(s): see the marked fields."
    problems = shown_problems(form, updates)
    assert set(problems) == {"num_prompts", "beta1"}
    assert f"at most {limit}" in problems["num_prompts"] and problems["beta1"].startswith("⚠ beta1 must be > 0")
    before = len(runs(form))
    updates = start(form, "train", event(form, beta1=0), None)
    assert updates[form.launched] is None and updates[form.status].startswith("❌ Not started: 1 problem(s)")
    assert len(runs(form)) == before


def test_sampling_with_vllm_is_disabled_with_the_reason_and_refused(form):
    checkbox = form.inputs["use_vllm"]
    assert checkbox.interactive is False
    assert checkbox.info.startswith("Not available here: use_vllm needs vLLM, which is not installed")
    assert form.inputs["vllm_gpu_memory_utilization"].interactive is False
    assert form.inputs["use_cpu"].interactive is not False  # the other advanced settings stay editable
    before = len(runs(form))
    updates = start(form, "train", event(form, use_vllm=True), None)
    assert list(shown_problems(form, updates)) == ["use_vllm"] and updates[form.launched] is None
    assert len(runs(form)) == before


def test_presets_methods_and_sources_switch_what_the_form_shows(form):
    updates = apply_preset(form, "none")  # the library's own defaults (TRL's)
    assert updates[form.inputs["max_completion_length"]]["value"] == 256
    assert updates[form.inputs["lora_r"]]["value"] == 16 and form.status not in updates
    shown = show_source(form, "hub")
    assert [shown[box]["visible"] for box in form.boxes] == [False, False, True, False, True]
    assert [show_source(form, "arithmetic")[box]["visible"] for box in form.boxes] == [True] + [False] * 4
    rewards = match_rewards(form, "reasoning-gym")
    assert {key for key, component in form.inputs.items()
            if component in rewards and rewards[component]["value"]} == {"use_reward:task_checker"}
    columns = show_method(form, "grpo")
    assert columns[form.param_columns["num_generations"]]["visible"] is True
    assert columns[form.param_columns["num_value_samples"]]["visible"] is False
    assert columns[form.param_columns["learning_rate"]]["visible"] is True


def test_a_loaded_spec_fills_the_form_only_through_the_allow_list(form):
    refused = load_spec(form, {"config": {"output_dir": "/etc"}}, "Loaded")
    assert list(refused) == [form.status]  # nothing filled
    assert refused[form.status].startswith("❌ Not loaded: Invalid run spec: config.output_dir: not allowed")
    filled = load_spec(form, {"name": "cloned", "config": {"beta2": 0.01}}, "Cloned run #1 as")
    assert filled[form.inputs["name"]]["value"] == "cloned" and filled[form.inputs["beta2"]]["value"] == 0.01
    assert filled[form.status].startswith("✅ Cloned run #1 as cloned: check the fields")


def test_a_sweep_grid_from_the_form_and_its_plan(form):
    data = {**event(form), form.sweep_field: "beta2"}
    line = add_sweep_field(form, data)
    assert line[form.sweep_grid] == "beta2: 0.001, " and line[form.sweep_field] is None
    data[form.sweep_grid] = "beta2: 0.001, 0.01"
    assert plan_sweep(form, data).startswith("**2 runs**: 2 grid point(s) x 1 seed(s)")
    assert plan_sweep(form, event(form)) == SWEEP_NOTE


def test_save_as_yaml_writes_a_config_the_cli_reads(form):
    from a2po.cli import spec_from_config_file

    updates = save_yaml(form, event(form, name="saved-run"))
    path = Path(updates[form.saved].value["path"] if isinstance(updates[form.saved].value, dict)
                else updates[form.saved].value)
    assert path.name == "config-saved-run.yaml" and updates[form.status].startswith("✅ Saved config-saved-run.yaml")
    assert spec_from_config_file(str(path)).name == "saved-run"


def test_a_budgeted_pair_gives_grpo_its_own_learning_rate_and_prompts_per_step_measured_for_the_preset(form):
    # Equal time or compute shows GRPO's own settings; a user's pick of it fills the preset's measured duel.
    assert show_protocol(form, "compute")[form.pair_grpo_prompts]["visible"] is True
    assert show_protocol(form, "paper")[form.pair_grpo_lr]["visible"] is False
    measured = pair_defaults(form, {form.protocol: "compute", form.preset: "teaching-demo"})
    assert [measured[c] for c in (form.pair_recipe, form.flops_budget, form.budget)] == ["dapo", 4e13, 4.0]
    assert (measured[form.pair_grpo_lr]["value"], measured[form.pair_grpo_prompts]["value"]) == (3e-5, 16)
    assert "measured best for GRPO" in measured[form.pair_grpo_lr]["info"]
    # A preset measured by no duel, or the paper's protocol (everything matched): TRL's GRPO, the general budgets.
    for protocol, preset in (("compute", "teaching-demo-lora"), ("paper", "teaching-demo")):
        general = pair_defaults(form, {form.protocol: protocol, form.preset: preset})
        assert general[form.pair_recipe] == "none" and general[form.pair_grpo_lr]["value"] is None
        assert general[form.pair_grpo_prompts]["value"] is None and general[form.flops_budget] == 1e15

    before = len(runs(form))
    data = {**event(form, name="budgeted-pair"), form.protocol: "compute", form.flops_budget: 4e13,
            form.pair_recipe: "dapo", form.pair_grpo_lr: 3e-5, form.pair_grpo_prompts: 2.5}
    assert "GRPO's prompts per step: give a whole number >= 1" in plan_pair(form, data)
    refused = start_pair(form, data, None)
    assert refused[form.status].startswith("❌ Not started: GRPO's prompts per step") and len(runs(form)) == before

    data[form.pair_grpo_prompts] = 16
    assert "**Learning rate:** A*-PO 1e-05, GRPO 3e-05." in plan_pair(form, data)
    updates = start_pair(form, data, None)
    assert updates[form.status].startswith("✅ Started A*-PO vs GRPO"), updates[form.status]
    a2po_id, grpo_id = updates[form.pair]
    a2po, grpo = (form.services.store.get_run(i)["config"] for i in (a2po_id, grpo_id))
    assert grpo["recipe"] == "dapo" and grpo["study"]["grpo_settings"] == {"learning_rate": 3e-5,
                                                                           "per_device_train_batch_size": 128}
    assert (grpo["config"]["learning_rate"], grpo["config"]["per_device_train_batch_size"]) == (3e-5, 16 * 8)
    assert (a2po["config"]["learning_rate"], a2po["config"]["per_device_train_batch_size"]) == (1e-5, 8)
    assert a2po["config"]["max_train_flops"] == grpo["config"]["max_train_flops"] == 4e13

    # 0 is what the browser sends for an empty field: matched to the A*-PO run's, as empty.
    empty = start_pair(form, {**data, form.pair_grpo_lr: 0, form.pair_grpo_prompts: 0}, None)
    grpo = form.services.store.get_run(empty[form.pair][1])["config"]
    assert (grpo["config"]["learning_rate"], grpo["config"]["per_device_train_batch_size"]) == (1e-5, 8 * 8)
    # The paper's protocol matches them: the fields (hidden there) are not read.
    paper = start_pair(form, {**data, form.protocol: "paper", form.pair_recipe: "none"}, None)
    grpo = form.services.store.get_run(paper[form.pair][1])["config"]
    assert (grpo["config"]["learning_rate"], grpo["config"]["per_device_train_batch_size"]) == (1e-5, 8 * 8)
