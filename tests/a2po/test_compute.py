"""A run's compute (`a2po.compute`): the formula on real passes, the budget `max_train_flops`, its evaluation grid, a
rung's share of it, and a seeded run under it giving the same history on a quiet machine and beside two busy loops."""

import math

import pytest
from datasets import Dataset
from peft import LoraConfig

from a2po import A2POConfig, A2POTrainer, GRPOConfig, GRPOTrainer
from a2po.compute import FlopsPerToken, format_flops, sequence_tokens
from a2po.testing import make_tiny_model
from tests.helpers import busy_cpus

# Keys a history holds that measure the machine, not the run: they differ between two runs of one seed.
MACHINE_KEYS = {"train_seconds", "eval_seconds", "step_seconds", "peak_memory_gb", "eval_runtime", "train_runtime",
                "train_samples_per_second", "train_steps_per_second", "eval_samples_per_second",
                "eval_steps_per_second", "values/train/runtime", "values/eval/runtime", "epoch_time"}


def prompts(n=8):
    return Dataset.from_list([{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)])


def coin(completions, **kwargs):
    return [float(sum(map(ord, c)) % 2 == 0) for c in completions]


def a2po_config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=50,
                  num_value_samples=4, max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none",
                  save_strategy="no", learning_rate=1e-2, seed=0, disable_tqdm=True, filter_all_incorrect=False,
                  gradient_checkpointing=False)
    values.update(overrides)
    return A2POConfig(**values)


def test_parameters_leave_out_embeddings_and_count_tied_weights_once():
    model, _ = make_tiny_model()
    counts = FlopsPerToken.of(model)
    embedding = model.get_input_embeddings().weight.numel()
    assert counts.parameters == model.num_parameters() - embedding  # the tied output matrix is the embedding
    assert counts.parameters == model.num_parameters(exclude_embeddings=True)  # transformers' own count
    assert counts.trainable == counts.parameters
    assert counts.forward(10) == 2 * counts.parameters * 10
    assert counts.train(10) == 6 * counts.parameters * 10  # a full fine-tune: Kaplan's 6 N per token


def test_lora_trains_only_its_adapters_weights():
    from peft import get_peft_model

    model, _ = make_tiny_model()
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    counts = FlopsPerToken.of(lora)
    adapters = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert counts.trainable == adapters
    assert counts.train(1) == 4 * counts.parameters + 2 * adapters  # no weight gradients for the frozen base


def test_sequence_tokens_counts_each_samples_prompt_and_no_padding():
    import torch

    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # 2 + 3 prompt tokens, left-padded
    completion_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])  # 2 samples of each prompt
    assert sequence_tokens(prompt_mask, completion_mask) == 2 * 5 + 6
    assert format_flops(3.2e15) == "3.2 PFLOP" and format_flops(None) == "–"


def step_tokens(trainer, samples):
    """Tokens of one step's sequences from its samples: each prompt as the model saw it, and the completion."""
    tokenizer = trainer.processing_class
    return sum(len(tokenizer(s["prompt_text"])["input_ids"]) + s["completion_length"] for s in samples)


class Samples:
    def __init__(self):
        self.steps = {}

    def on_samples(self, args, state, control, samples, **kwargs):
        for sample in samples:
            if sample["split"] == "train":
                self.steps.setdefault(sample["step"], []).append(sample)

    def __getattr__(self, name):  # every other event: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def test_a2po_step_is_sampling_reference_and_training_passes(tmp_path, tiny_model_dir):
    samples = Samples()
    trainer = A2POTrainer(tiny_model_dir, coin, a2po_config(tmp_path, max_steps=2), train_dataset=prompts(),
                          callbacks=[samples])
    trainer.train()
    p = trainer.flops_per_token.parameters
    tokens = [step_tokens(trainer, samples.steps[step]) for step in (1, 2)]
    # Per token: 2P to sample it, 2P for the reference's log-probability, 6P to train on it.
    assert trainer.run_counters.train_flops == pytest.approx(10 * p * sum(tokens))
    assert trainer.state.total_flos == pytest.approx(trainer.run_counters.train_flops)  # the Trainer's own count
    stage_one = trainer.run_counters.values_flops["train"]
    assert stage_one > 0 and trainer.run_counters.compute == pytest.approx(stage_one + 10 * p * sum(tokens))
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged[-1]["train_flops"] == pytest.approx(trainer.run_counters.train_flops)
    assert logged[-1]["compute_flops"] == pytest.approx(trainer.run_counters.compute)


def test_grpo_step_counts_every_completion_of_the_group(tmp_path, tiny_model_dir):
    samples = Samples()
    args = GRPOConfig(output_dir=str(tmp_path / "g"), per_device_train_batch_size=8, num_generations=4, max_steps=2,
                      max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                      seed=0, disable_tqdm=True, gradient_checkpointing=False)
    trainer = GRPOTrainer(tiny_model_dir, coin, args, train_dataset=prompts(), callbacks=[samples])
    trainer.train()
    p = trainer.flops_per_token.parameters
    tokens = sum(step_tokens(trainer, samples.steps[step]) for step in (1, 2))
    # beta = 0: no reference; one iteration: no pass for the old policy. 2P to sample, 6P to train.
    assert trainer.run_counters.train_flops == pytest.approx(8 * p * tokens)
    assert "train" not in trainer.run_counters.values_flops  # no stage 1 without a pass-rate band


def history(trainer):
    return [{k: v for k, v in h.items() if k not in MACHINE_KEYS} for h in trainer.state.log_history]


def budget_run(tmp_path, tiny_model_dir, name, share=1.0, **overrides):
    args = a2po_config(tmp_path / name, **overrides)
    trainer = A2POTrainer(tiny_model_dir, coin, args, train_dataset=prompts(), eval_dataset=prompts(4))
    trainer.run_counters.budget_share = share
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def budget(tmp_path_factory, tiny_model_dir):
    """A budget of the stage 1 plus about 6 training steps, from a probe run's own counts."""
    probe = budget_run(tmp_path_factory.mktemp("probe"), tiny_model_dir, "probe", max_steps=2)
    per_step = probe.run_counters.train_flops / 2
    return probe.run_counters.values_flops["train"] + 6.5 * per_step


def test_a_compute_budget_stops_when_spent_and_evaluates_on_its_grid(tmp_path, tiny_model_dir, budget):
    trainer = budget_run(tmp_path, tiny_model_dir, "quiet", max_train_flops=budget, eval_every_flops=budget / 4)
    counters = trainer.run_counters
    assert counters.compute >= budget
    steps = [h["step"] for h in trainer.state.log_history if "eval_accuracy" in h]
    computes = [h["compute_flops"] for h in trainer.state.log_history if "eval_accuracy" in h]
    # The grid: one evaluation at the first step past each multiple of budget / 4, the last at the budget's end.
    assert steps[-1] == trainer.state.global_step
    crossings = {math.floor(c / (budget / 4)) for c in computes}
    assert len(crossings) == len(computes) and len(computes) >= 3
    # It stopped at the first step whose end passed the budget.
    logged = [h["compute_flops"] for h in trainer.state.log_history if "loss" in h]
    assert logged[-1] >= budget > logged[-2]


def test_a_rung_spends_its_share_of_the_training_part_and_is_a_prefix_of_the_whole_run(tmp_path, tiny_model_dir,
                                                                                      budget):
    whole = budget_run(tmp_path, tiny_model_dir, "whole", max_train_flops=budget, eval_every_flops=budget / 4)
    rung = budget_run(tmp_path, tiny_model_dir, "rung", share=1 / 3, max_train_flops=budget,
                      eval_every_flops=budget / 4)
    stage_one = rung.run_counters.values_flops["train"]
    target = stage_one + (budget - stage_one) / 3
    logged = [h["compute_flops"] for h in rung.state.log_history if "loss" in h]
    assert logged[-1] >= target > logged[-2]
    losses = [h["loss"] for h in whole.state.log_history if "loss" in h]
    assert [h["loss"] for h in rung.state.log_history if "loss" in h] == losses[:len(logged)]
    assert rung.state.global_step < whole.state.global_step


@pytest.mark.serial
def test_a_seeded_run_under_a_compute_budget_has_one_history_quiet_or_loaded(tmp_path, tiny_model_dir, budget):
    quiet = budget_run(tmp_path, tiny_model_dir, "quiet", max_train_flops=budget, eval_every_flops=budget / 4)
    with busy_cpus(2):
        loaded = budget_run(tmp_path, tiny_model_dir, "loaded", max_train_flops=budget, eval_every_flops=budget / 4)
    assert history(loaded) == history(quiet)
    assert loaded.state.global_step == quiet.state.global_step > 2
