"""Batch figures (`a2po.batches`): prompts, completions and generations per optimizer step for both methods, as TRL
1.16 counts them, and the Launch page, the pair plan, the Run page header and the verdict saying them."""


import pytest

from a2po import A2POConfig, GRPOConfig
from a2po.batches import batch_figures, spec_batch_figures
from app.studies import comparison

FIGURES = ["prompts_per_step", "generations_per_prompt", "completions_per_step", "completions_per_micro_batch",
           "stage1_samples_per_prompt"]


@pytest.mark.parametrize("method, config, processes, expected", [
    # A*-PO: the batch counts prompts, one completion each; N reference samples per prompt in stage 1.
    ("a2po", {}, 1, (8, 1, 8, 8, 8)),
    ("a2po", {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_value_samples": 16}, 2,
     (16, 1, 16, 4, 16)),
    # GRPO: the batch counts completions, G per prompt (TRL's default: one prompt per step at batch 8, G 8).
    ("grpo", {}, 1, (1, 8, 8, 8, 0)),
    ("grpo", {"per_device_train_batch_size": 64, "gradient_accumulation_steps": 2, "num_generations": 8}, 1,
     (16, 8, 128, 64, 0)),
    ("grpo", {"per_device_train_batch_size": 16, "num_generations": 4}, 2, (8, 4, 32, 16, 0)),
    # GRPO that selects by pass rate samples stage 1 too.
    ("grpo", {"per_device_train_batch_size": 32, "num_generations": 4, "num_value_samples": 8,
              "pass_rate_band": [0.125, 0.875]}, 1, (8, 4, 32, 32, 8)),
])
def test_figures_against_hand_computed_values(method, config, processes, expected):
    figures = batch_figures(method, config, processes)
    assert tuple(getattr(figures, name) for name in FIGURES) == expected
    assert figures.processes == processes


def test_configs_agree_with_the_library_and_trl():
    """A built config gives its own `prompts_per_step`; GRPO's prompts per step are TRL 1.16's
    generation_batch_size / num_generations (one generation per optimizer step by default)."""
    common = dict(output_dir="/tmp/h8-batch", use_cpu=True, report_to="none")
    grpo = GRPOConfig(**common, per_device_train_batch_size=24, gradient_accumulation_steps=2, num_generations=6)
    a2po = A2POConfig(**common, per_device_train_batch_size=6, gradient_accumulation_steps=3)
    assert batch_figures("grpo", grpo).prompts_per_step == grpo.prompts_per_step == 8
    assert batch_figures("a2po", a2po).prompts_per_step == a2po.prompts_per_step == 18
    from trl import GRPOConfig as TRLGRPOConfig

    trl = TRLGRPOConfig(**common, per_device_train_batch_size=24, gradient_accumulation_steps=2, num_generations=6)
    assert trl.generation_batch_size // trl.num_generations == batch_figures("grpo", grpo).prompts_per_step
    assert trl.generation_batch_size == batch_figures("grpo", grpo).completions_per_step


def test_text_says_each_figure():
    assert batch_figures("a2po", {"per_device_train_batch_size": 8}).text() == (
        "8 prompts per step × 1 completion each = 8 completions per step (8 per micro-batch); stage 1: 8 reference "
        "samples per prompt, once")
    assert batch_figures("grpo", {"per_device_train_batch_size": 64, "num_generations": 8}, 2).text() == (
        "16 prompts per step × 8 completions each (G) = 128 completions per step (64 per micro-batch, 2 processes)")
    assert batch_figures("grpo", {"per_device_train_batch_size": 8, "num_generations": 4,
                                  "pass_rate_band": [0.2, 0.8]}).text().endswith(
        "; stage 1: 8 reference samples per prompt, once, to select prompts by pass rate")
    assert spec_batch_figures({"config": {}}) is None  # a spec that states no batch is not guessed
    assert spec_batch_figures({"config": {"per_device_train_batch_size": "x"}}) is None
    with pytest.raises(ValueError, match="Unknown method 'ppo'"):
        batch_figures("ppo", {})


SPEC = {"name": "demo", "action": "train", "model": "m", "rewards": [{"name": "exact_match", "weight": 1.0}],
        "dataset": {"source": "arithmetic", "num_prompts": 256, "eval_size": 128},
        "config": {"num_value_samples": 8, "learning_rate": 1e-5, "max_steps": -1, "num_train_epochs": 4.0,
                   "per_device_train_batch_size": 8, "max_completion_length": 12, "seed": 1}}


def test_the_launch_page_and_the_pair_plan_say_them():
    from app.web.pages.launch.plans import batch_text, pair_plan_text

    grpo = {"method": "grpo", "config": {"per_device_train_batch_size": 64, "num_generations": 8,
                                         "gradient_accumulation_steps": 1}}
    assert batch_text(grpo) == ("**Per optimizer step:** 8 prompts per step × 8 completions each (G) = 64 completions "
                                "per step (64 per micro-batch) (GRPO's batch size counts completions, as TRL's).")
    plan = pair_plan_text(SPEC, "paper", "", None, [])
    assert plan.split("\n\n")[-1] == (
        "**Per optimizer step:** A*-PO 8 prompts per step × 1 completion each = 8 completions per step (8 per "
        "micro-batch); stage 1: 8 reference samples per prompt, once; GRPO 8 prompts per step × 8 completions each "
        "(G) = 64 completions per step (64 per micro-batch).")


def test_the_launch_form_shows_them_next_to_the_batch_settings():
    from app.web import forms
    from app.web.pages.launch.plans import batch_text

    form = forms.default_form()
    form.update(method="grpo", per_device_train_batch_size=32, num_generations=4, gradient_accumulation_steps=2)
    assert "16 prompts per step × 4 completions each (G) = 64 completions per step (32 per micro-batch)" in batch_text(
        forms.form_to_spec(form))


def test_the_run_header_says_them():
    from app.web.pages.run.header import header

    run = {"id": 3, "name": "g", "status": "running", "action": "train", "model": "m", "dataset": "arithmetic",
           "created_at": 0.0, "started_at": None, "config": {"method": "grpo", "config": {
               "per_device_train_batch_size": 16, "num_generations": 4}}}
    assert ('<span id="run-batch">per optimizer step: 4 prompts per step × 4 completions each (G) = 16 completions '
            "per step (16 per micro-batch)</span>") in header(run)


def test_the_verdict_says_them():
    def line(run_id, method, config):
        run = {"id": run_id, "name": method, "status": "finished",
               "config": {"method": method, "config": config, "dataset": {"eval_size": 8}}}
        evaluations = [{"step": s, "split": "eval", "created_at": float(s),
                        "metrics": {"eval_accuracy": a, "train_seconds": 10.0 * s}}
                       for s, a in [(0, 0.1), (4, 0.5), (8, 0.6)]]
        return comparison.timeline(run, evaluations, [])

    a2po = line(1, "a2po", {"per_device_train_batch_size": 8})
    grpo = line(2, "grpo", {"per_device_train_batch_size": 64, "num_generations": 8})
    assert comparison.verdict(a2po, grpo).endswith(
        " Per optimizer step: A\\*-PO 8 prompts per step × 1 completion each = 8 completions per step (8 per "
        "micro-batch); stage 1: 8 reference samples per prompt, once; GRPO 8 prompts per step × 8 completions each "
        "(G) = 64 completions per step (64 per micro-batch).")
