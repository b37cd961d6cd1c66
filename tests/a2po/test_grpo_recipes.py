"""Named GRPO recipes (`a2po.recipes`): each gives TRL's settings, in the library, the CLI (flags win), the studio's
allow-list, the Launch form's handlers and the GRPO side of "A*-PO vs GRPO", launched through the gate.

The expected values are written out from TRL's paper index (huggingface/trl, docs/source/paper_index.md, "Group
Relative Policy Optimization": the `GRPOConfig(...)` of each paper), and Dr. GRPO's scale_rewards from TRL 1.16's
GRPOConfig help ("The Dr. GRPO paper recommends not scaling rewards"). Real SQLite files and a real, never started
scheduler; one real CLI training run.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest
import torch

from a2po import cli
from a2po.config import A2POConfig, GRPOConfig
from a2po.recipes import RECIPE_SETTINGS, RECIPES, RecipeError, canonical_name, off_policy_note
from a2po.runspec import RunSpec, SpecError, with_defaults
from app.access import allowlist
from app.access.auth import LOCAL_USER
from app.access.gate import Refused, Services
from app.runtime.devices import Devices
from app.runtime.scheduler import Scheduler
from app.studies.protocols import SHARED_SETTINGS
from app.web import forms
from app.web.pages.launch.actions import load_spec, pick_recipe, show_method, show_recipe, start, start_pair
from app.web.pages.launch.form import LaunchForm
from app.web.pages.launch.page import build_launch_page
from app.web.pages.launch.plans import plan_pair
from storage import Store

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# TRL's paper index, setting by setting (only the algorithm's switches: see a2po.recipes on the paper's scale).
TRL_SETTINGS = {
    "dapo": {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "mask_truncated_completions": True,
             "beta": 0.0},
    "dapo-high-entropy": {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28,
                          "mask_truncated_completions": True, "beta": 0.0, "top_entropy_quantile": 0.2},
    "dr-grpo": {"loss_type": "dr_grpo", "beta": 0.0, "scale_rewards": "none"},
    "gspo": {"importance_sampling_level": "sequence", "loss_type": "grpo", "beta": 0.0, "epsilon": 3e-4,
             "epsilon_high": 4e-4},
    "lite-ppo": {"scale_rewards": "batch", "loss_type": "dapo", "beta": 0.0},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0, "scale_rewards": "batch"},
    "sapo": {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05,
             "scale_rewards": "group"},
    "gdpo": {"multi_objective_aggregation": "normalize_then_sum"},
    "luspo": {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 2e-3,
              "epsilon_high": 2.5e-3},
}
TRL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}


def config_of(spec: dict) -> GRPOConfig:
    return RunSpec.from_dict(with_defaults(spec)).build_config("/tmp/grpo-recipe-check", use_cpu=True)


# ------------------------------------------------------------------------------------------------------ library

def test_the_table_holds_the_recipes_of_trls_paper_index():
    assert set(RECIPES) == set(TRL_SETTINGS)
    assert {r.arxiv for r in RECIPES.values()} >= {"2503.14476", "2503.20783", "2507.18071", "2508.08221",
                                                   "2506.13585", "2511.20347", "2601.05242", "2602.05261"}


@pytest.mark.parametrize("name", list(TRL_SETTINGS))
def test_every_recipe_gives_a_valid_grpo_config_with_trls_values(name):
    config = config_of({"method": "grpo", "recipe": name})
    assert {k: getattr(config, k) for k in TRL_SETTINGS[name]} == TRL_SETTINGS[name]
    for key in set(RECIPE_SETTINGS) - set(TRL_SETTINGS[name]):  # what the recipe leaves stays TRL's default
        assert getattr(config, key) == TRL_DEFAULTS[key], key


def test_recipes_set_only_what_grpo_alone_has_so_a_duel_stays_matched():
    a2po_fields = {f.name for f in dataclasses.fields(A2POConfig)}
    assert not set(RECIPE_SETTINGS) & (a2po_fields | set(SHARED_SETTINGS))


def test_a_recipes_settings_lose_to_the_specs_own_and_win_over_the_preset():
    spec = RunSpec.from_dict(with_defaults({"method": "grpo", "recipe": "Dr_GRPO", "config": {"beta": 0.04}}))
    assert spec.recipe == "dr-grpo"  # spelled as the table spells it
    assert (spec.config["loss_type"], spec.config["scale_rewards"], spec.config["beta"]) == ("dr_grpo", "none", 0.04)
    assert spec.to_dict()["recipe"] == "dr-grpo" and "recipe" not in RunSpec.from_dict(
        with_defaults({"method": "grpo"})).to_dict()
    # The command and YAML file of a spec run it again, recipe included.
    assert "--recipe dr-grpo" in spec.command() and "recipe: dr-grpo" in spec.to_yaml()


def test_unknown_and_misplaced_recipes_are_refused_naming_the_recipes():
    with pytest.raises(RecipeError, match="Unknown GRPO recipe 'dapo2': use one of dapo, dapo-high-entropy, dr-grpo"):
        canonical_name("dapo2")
    with pytest.raises(SpecError) as refused:
        RunSpec.from_dict(with_defaults({"method": "grpo", "recipe": "dapo2"}))
    assert "gspo, lite-ppo, cispo, sapo, gdpo, luspo" in refused.value.problems["recipe"]
    with pytest.raises(SpecError) as refused:
        RunSpec.from_dict(with_defaults({"recipe": "dapo"}))
    assert refused.value.problems["recipe"].startswith("recipe names a GRPO variant")


def test_the_form_says_which_settings_act_only_off_policy():
    note = off_policy_note("gspo", {"num_iterations": 1})
    assert note.startswith("importance_sampling_level, epsilon, epsilon_high act only off-policy")
    assert off_policy_note("gspo", {"num_iterations": 2}) == ""
    assert off_policy_note("dr-grpo", {"num_iterations": 1}) == ""  # every setting of Dr. GRPO acts on-policy
    assert "more than one reward function" in off_policy_note("gdpo", {}, num_rewards=1)
    assert off_policy_note("gdpo", {}, num_rewards=2) == ""


# ------------------------------------------------------------------------------------------------------ CLI

def spec_from_flags(*flags: str) -> RunSpec:
    command, script, _, fields = cli.parse(["train", *flags])
    return cli.spec_from_args(command, script, fields)


def test_cli_flags_win_over_the_recipe(tmp_path):
    spec = spec_from_flags("--method", "grpo", "--recipe", "dapo", "--epsilon_high", "0.3")
    assert spec.recipe == "dapo"
    assert {k: spec.config[k] for k in TRL_SETTINGS["dapo"]} == {**TRL_SETTINGS["dapo"], "epsilon_high": 0.3}
    (tmp_path / "run.yaml").write_text("method: grpo\nrecipe: gspo\nepsilon: 0.001\n")
    from_file = spec_from_flags("--config", str(tmp_path / "run.yaml"), "--epsilon_high", "0.002")
    assert from_file.recipe == "gspo"
    assert {k: from_file.config[k] for k in ("importance_sampling_level", "epsilon", "epsilon_high")} == {
        "importance_sampling_level": "sequence", "epsilon": 0.001, "epsilon_high": 0.002}
    # The command the spec renders runs the same spec.
    again = spec_from_flags(*spec.to_cli_args()[1:])
    assert (again.recipe, again.config) == (spec.recipe, spec.config)


def test_cli_refuses_a_recipe_without_grpo_or_unknown_before_anything_runs():
    with pytest.raises(SystemExit, match="--recipe dapo names a GRPO variant: add --method grpo"):
        cli.parse(["train", "--recipe", "dapo"])
    with pytest.raises(SystemExit, match="--recipe: Unknown GRPO recipe 'nope': use one of dapo"):
        cli.parse(["train", "--method", "grpo", "--recipe", "nope"])


@pytest.mark.slow
def test_cli_trains_grpo_with_a_recipe(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "a2po", "train", "--method", "grpo", "--recipe", "dr-grpo", "--beta", "0.01",
         "--model", tiny_model_dir, "--dataset", "arithmetic", "--num_prompts", "4", "--eval_size", "0",
         "--num_generations", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "4",
         "--max_steps", "1", "--use_cpu", "true", "--save_strategy", "no", "--output_dir", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(out / "training_args.bin", weights_only=False)
    assert (saved.loss_type, saved.scale_rewards, saved.beta) == ("dr_grpo", "none", 0.01)


# ------------------------------------------------------------------------------------------------------ studio

@pytest.fixture(scope="module")
def services(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("recipes")
    store = Store(data_dir / "studio.db")
    scheduler = Scheduler(store, data_dir, devices=Devices.parse("none"))  # never started: the runs stay queued
    yield Services(store=store, scheduler=scheduler, data_dir=data_dir)
    scheduler.close()


def test_the_allow_list_accepts_a_recipe_and_refuses_an_unknown_one(services):
    result = allowlist.check_spec({"method": "grpo", "recipe": "gspo", "config": {"epsilon": 1e-3}}, services.policy,
                                  offline=True)
    assert result.ok, result.errors
    assert result.spec["recipe"] == "gspo"
    assert {k: result.spec["config"][k] for k in TRL_SETTINGS["gspo"]} == {**TRL_SETTINGS["gspo"], "epsilon": 1e-3}
    refused = allowlist.check_spec({"method": "grpo", "recipe": "ppo"}, services.policy, offline=True)
    assert not refused.ok and "Unknown GRPO recipe 'ppo': use one of dapo" in refused.errors["recipe"]


@pytest.mark.parametrize("recipe", ["dapo", "dr-grpo"])
def test_a_duel_whose_grpo_side_runs_a_recipe_through_the_gate(services, recipe):
    store = services.store
    spec = {"name": f"duel-{recipe}", "config": {"max_steps": 2}}
    a2po_id, grpo_id = services.launch_pair(spec, LOCAL_USER, grpo_recipe=recipe)[0]
    plain_a2po, plain_grpo = services.launch_pair({**spec, "name": "duel-plain"}, LOCAL_USER)[0]
    grpo, plain = store.get_run(grpo_id)["config"], store.get_run(plain_grpo)["config"]
    assert grpo["recipe"] == recipe and "recipe" not in plain  # the default duel is unchanged
    assert {k: grpo["config"][k] for k in TRL_SETTINGS[recipe]} == TRL_SETTINGS[recipe]
    assert grpo["study"]["grpo_recipe"] == recipe
    built = RunSpec.from_dict({k: v for k, v in grpo.items()}).build_config("/tmp/duel-check", use_cpu=True)
    assert {k: getattr(built, k) for k in TRL_SETTINGS[recipe]} == TRL_SETTINGS[recipe]  # what the worker builds
    # Everything else of the GRPO side is the plain duel's: the match to A*-PO holds.
    differs = {k for k in grpo["config"].keys() | plain["config"].keys()
               if grpo["config"].get(k) != plain["config"].get(k)}
    assert differs <= set(TRL_SETTINGS[recipe])
    assert store.get_run(a2po_id)["config"]["config"] == store.get_run(plain_a2po)["config"]["config"]
    before = len(store.list_runs())
    with pytest.raises(Refused, match="grpo_recipe: Unknown GRPO recipe 'dapo3'"):
        services.launch_pair(spec, LOCAL_USER, grpo_recipe="dapo3")
    assert len(store.list_runs()) == before


# ------------------------------------------------------------------------------------------------------ Launch form

@pytest.fixture(scope="module")
def form(services) -> LaunchForm:
    with gr.Blocks():
        page = build_launch_page(services)
    return page.form


def event(form: LaunchForm, **fields) -> dict:
    """What the browser sends for the form as it opens, with `fields` (by form key) changed."""
    data = {component: component.value for component in form.fields}
    data.update({form.inputs[key]: value for key, value in fields.items()})
    return {**data, form.token: None, form.seeds: "", form.protocol: "paper", form.budget: 10, form.flops_budget: 1e15,
            form.pair_recipe: forms.NO_RECIPE, form.pair_grpo_lr: None, form.pair_grpo_prompts: None,
            form.sweep_grid: "", form.sweep_field: None}


def picked(form: LaunchForm, recipe: str, **fields) -> dict:
    """The form's fields after picking `recipe` (its handler's updates applied), with `fields` changed after."""
    updates = pick_recipe(form, event(form, method="grpo", recipe=recipe))
    values = {key: updates[component]["value"] for key, component in form.inputs.items() if component in updates}
    return {"method": "grpo", "recipe": recipe, **values, **fields}


def test_the_launch_form_offers_recipes_for_grpo_runs(form):
    assert form.inputs["recipe"].value == forms.NO_RECIPE
    assert [value for _, value in form.inputs["recipe"].choices] == [forms.NO_RECIPE, *RECIPES]
    assert show_method(form, "grpo")[form.recipe_box]["visible"] is True
    assert show_method(form, "a2po")[form.recipe_box]["visible"] is False
    gspo = picked(form, "gspo")
    assert {k: gspo[k] for k in TRL_SETTINGS["gspo"]} == TRL_SETTINGS["gspo"]
    assert gspo["mask_truncated_completions"] is False and gspo["scale_rewards"] == "group"  # TRL's, not the last
    note = show_recipe(form, event(form, **gspo))
    assert "GSPO (arXiv 2507.18071)" in note and "act only off-policy" in note
    assert "act only off-policy" not in show_recipe(form, event(form, **gspo, num_iterations=2))
    assert "none: GRPO with TRL's GRPOConfig defaults" in show_recipe(form, event(form))


def test_a_grpo_run_started_from_the_form_records_its_recipe(form):
    fields = picked(form, "cispo", epsilon_high=4.0, name="cispo-from-the-form")  # a field changed after wins
    updates = start(form, "train", event(form, **fields), None)
    run = form.services.store.get_run(updates[form.launched])["config"]
    assert run["recipe"] == "cispo" and run["method"] == "grpo"
    assert {k: run["config"][k] for k in TRL_SETTINGS["cispo"]} == {**TRL_SETTINGS["cispo"], "epsilon_high": 4.0}
    # Cloned into the form, the run shows its recipe and settings again.
    filled = load_spec(form, run, "Cloned")
    assert filled[form.inputs["recipe"]]["value"] == "cispo" and filled[form.inputs["epsilon_high"]]["value"] == 4.0


def test_the_pair_form_runs_its_grpo_side_under_the_chosen_recipe(form):
    data = {**event(form, name="pair-from-the-form", max_steps=2), form.pair_recipe: "dapo"}
    assert "**GRPO side:** DAPO (arXiv 2503.14476)" in plan_pair(form, data)
    updates = start_pair(form, data, None)
    assert updates[form.status].startswith("✅ Started A*-PO vs GRPO"), updates[form.status]
    a2po_id, grpo_id = updates[form.pair]
    grpo = form.services.store.get_run(grpo_id)["config"]
    assert grpo["recipe"] == "dapo"
    assert {k: grpo["config"][k] for k in TRL_SETTINGS["dapo"]} == TRL_SETTINGS["dapo"]
    assert "recipe" not in form.services.store.get_run(a2po_id)["config"]
