"""GRPOTrainer end to end on the tiny model: training, batches, advantages, the shared metrics and samples, the
reference policy, evaluation, gradient accumulation, and resuming between the iterations of a generation."""

import math
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from a2po import GRPOConfig, GRPOTrainer
from tests.a2po.test_trainer import Recorder, coin, prompts

SHARED_METRICS = ("loss", "reward", "reward_std", "accuracy", "completion_length", "completion_clipped_frac",
                  "frac_nonfinite_loss", "completion_tokens", "peak_memory_gb")


def config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2, max_steps=2,
                  max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                  learning_rate=1e-2, seed=0, disable_tqdm=True, gradient_checkpointing=False)
    values.update(overrides)
    return GRPOConfig(**values)


def losses(trainer):
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


@pytest.mark.parametrize("field, value, message", [
    ("num_generations", 1, "num_generations must be >= 2"),
    ("per_device_train_batch_size", 3, "must be a multiple of num_generations"),
    ("loss_type", "ppo", "loss_type must be one of"),
    ("scale_rewards", "mean", "scale_rewards must be one of"),
    ("beta", -0.1, "beta must be >= 0"),
    ("num_iterations", 0, "num_iterations must be >= 1"),
])
def test_config_rejects_impossible_values(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **{field: value})


def test_config_counts_completions_and_names_scalings_as_trl(tmp_path):
    args = config(tmp_path, per_device_train_batch_size=6, gradient_accumulation_steps=2, num_generations=3)
    assert args.prompts_per_step == 4  # 6 completions x 2 micro-batches / G = 3
    assert config(tmp_path, scale_rewards=True).scale_rewards == "group"
    assert config(tmp_path, scale_rewards=False).scale_rewards == "none"
    assert config(tmp_path, scale_rewards="false").scale_rewards == "none"  # as the command line gives it


def test_training_changes_every_parameter_logs_the_shared_metrics_and_g_samples_per_prompt(tmp_path, tiny_model_dir):
    recorder = Recorder()
    trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, beta=0.04), train_dataset=prompts(8),
                          callbacks=[recorder])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert sorted(changed) == sorted(before)
    first, second = [h for h in trainer.state.log_history if "loss" in h]
    for key in (*SHARED_METRICS, "kl", "rewards/coin", "frac_reward_zero_std", "clip_ratio/region_mean"):
        assert key in first, key
    assert 0 < first["completion_tokens"] <= 4 * 6  # 4 completions of at most 6 tokens
    assert second["completion_tokens"] > first["completion_tokens"] and first["frac_nonfinite_loss"] == 0.0
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference until the first update
    samples = recorder.of("samples")[0]["samples"]
    assert len(samples) == 4 and [s["sample_index"] for s in samples] == [0, 1, 0, 1]
    assert samples[0]["prompt_id"] == samples[1]["prompt_id"] != samples[2]["prompt_id"]
    assert all(s["v_star"] is None and s["implicit_reward"] is None and s["step"] == 1 for s in samples)
    for group in (samples[:2], samples[2:]):  # advantages of a group sum to 0
        assert sum(s["advantage"] for s in group) == pytest.approx(0.0, abs=1e-5)
    # GRPO has no stage 1 unless it selects prompts by pass rate (tests/a2po/test_pass_rate_selection.py)
    assert not trainer.samples_stage_one and trainer.run_counters.values_seconds == {}


def test_equal_rewards_give_zero_advantage_and_no_update(tmp_path, tiny_model_dir):
    """A group whose rewards are all equal carries no signal: advantage 0, loss 0, `frac_reward_zero_std` 1."""
    always = lambda completions, **kw: [1.0] * len(completions)  # noqa: E731
    recorder = Recorder()
    trainer = GRPOTrainer(tiny_model_dir, always, args=config(tmp_path), train_dataset=prompts(8),
                          callbacks=[recorder])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["frac_reward_zero_std"] for h in logged] == [1.0, 1.0] and [h["loss"] for h in logged] == [0.0, 0.0]
    assert {s["advantage"] for kw in recorder.of("samples") for s in kw["samples"]} == {0.0}


def test_beta_zero_loads_no_reference_and_runs_no_reference_pass(tmp_path, tiny_model_dir):
    from peft import LoraConfig

    trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path), train_dataset=prompts(4))
    assert trainer.ref_model is None

    def no_reference():
        raise AssertionError("beta = 0 needs no reference policy")

    trainer._reference_policy = no_reference
    trainer.train()
    assert GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, beta=0.1)).ref_model is not None
    lora = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, beta=0.1), train_dataset=prompts(4),
                       peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert lora.ref_model is None  # the reference is the model with its adapters off
    lora.train()
    assert [h["kl"] for h in lora.state.log_history if "loss" in h][0] == pytest.approx(0.0, abs=1e-6)


def test_a_completion_depends_on_the_seed_step_prompt_and_sample_index_only(tmp_path, tiny_model_dir):
    """The G samples of a prompt share its prefill but each has its own random stream (seed, phase, step, prompt id,
    sample index): a wider batch, other prompts beside it or what ran before change none of them."""
    def first_step(batch, seed=0):
        recorder = Recorder()
        trainer = GRPOTrainer(tiny_model_dir, coin, callbacks=[recorder], train_dataset=prompts(8),
                              args=config(tmp_path, per_device_train_batch_size=batch, max_steps=1, seed=seed,
                                          shuffle_dataset=False))
        torch.rand(100)  # the global random stream moved: it must not matter
        trainer.train()
        return {(s["prompt_id"], s["sample_index"]): s["completion"] for s in recorder.of("samples")[0]["samples"]}

    narrow, wide = first_step(4), first_step(8)
    assert len(narrow) == 4 and len(wide) == 8 and all(wide[key] == text for key, text in narrow.items())
    assert len(set(wide.values())) > 4  # the samples of a prompt differ from each other
    assert first_step(4, seed=1) != narrow


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_gradient_accumulation_gives_the_same_update_as_one_batch(tmp_path, tiny_model_dir, loss_type):
    """One generation per optimizer step, split into micro-batches in order: the update of 2 x 2 completions with
    accumulation is that of one batch of 4 (the samples are the same: they depend on the step, not the batching),
    whatever each loss type normalises by (the step's tokens: dapo, cispo, vespo; micro-batch means: grpo, sapo,
    luspo)."""
    def trained(batch, accumulation, where):
        args = config(tmp_path / where, per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                      max_steps=1, optim="sgd", learning_rate=0.5, max_grad_norm=1e9, lr_scheduler_type="constant",
                      loss_type=loss_type, shuffle_dataset=False,
                      importance_sampling_level="sequence" if loss_type == "luspo" else "token")
        trainer = GRPOTrainer(tiny_model_dir, coin, args=args, train_dataset=prompts(8))
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, losses(trainer)[1]

    (one_batch, loss), (accumulated, accumulated_loss) = trained(4, 1, "a"), trained(2, 2, "b")
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert any(not torch.allclose(one_batch[n], initial[n].detach()) for n in one_batch)
    assert accumulated_loss == pytest.approx(loss, abs=1e-6)
    for name in one_batch:
        assert torch.allclose(one_batch[name], accumulated[name], atol=1e-5), name


def test_the_native_decoder_ignores_the_vllm_correction(tmp_path, tiny_model_dir):
    """vllm_importance_sampling_correction (on by default, as in TRL) applies where vLLM samples: the native decoder
    samples the trainer's own distribution, so there is no weight, no extra forward pass and no metric."""
    args = config(tmp_path, vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=0.5)
    assert args.vllm_importance_sampling_correction and not args.use_vllm
    trainer = GRPOTrainer(tiny_model_dir, coin, args=args, train_dataset=prompts(8))
    trainer.train()
    assert not any(key.startswith("sampling/") for h in trainer.state.log_history for key in h)
    assert not {"old_logps", "sampling_logps", "sampling_weights"} & set(trainer._buffer[0])


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resumed_between_the_iterations_of_a_generation_gives_the_uninterrupted_losses(tmp_path, tiny_model_dir):
    """num_iterations = 2 trains each generation for two steps. A checkpoint after the first of them (step 5, in the
    second epoch) holds the generation; a run resumed from it ends with the uninterrupted run's losses and counters.
    Without the saved generation the resumed run samples new completions and departs from it."""
    settings = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8, num_iterations=2,
                    beta=0.04, epsilon_high=0.28)

    def run(where, resume=None, callbacks=(), **extra):
        trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path / where, **settings, **extra),
                              train_dataset=prompts(4), callbacks=list(callbacks))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run("whole")
    assert len(losses(whole)) == 8 and whole.state.epoch == 2.0  # 4 prompts, 2 per step, 2 steps per generation
    run("first", save_strategy="steps", save_steps=5, callbacks=[StopAt(5)])
    checkpoint = tmp_path / "first" / "out" / "checkpoint-5"
    assert (checkpoint / "generation_buffer.pt").is_file()

    resumed = run("first", resume=str(checkpoint))
    after = {step: loss for step, loss in losses(resumed).items() if step > 5}  # the log before comes from step 5
    assert sorted(after) == [6, 7, 8]
    for step, loss in after.items():
        assert loss == pytest.approx(losses(whole)[step], abs=1e-6), step
    last = [h for h in whole.state.log_history if "loss" in h][-1]
    assert [h for h in resumed.state.log_history if "loss" in h][-1]["completion_tokens"] == last["completion_tokens"]

    (checkpoint / "generation_buffer.pt").unlink()
    with pytest.warns(UserWarning, match="without its saved completions"):
        departed = run("first", resume=str(checkpoint))
    assert not math.isclose(losses(departed)[6], losses(whole)[6], abs_tol=1e-6)


def test_evaluation_reports_greedy_accuracy_and_runs_every_eval_steps(tmp_path, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    even = lambda completions, parity, **kw: [1.0 if p == "even" else 0.0 for p in parity]  # noqa: E731
    recorder = Recorder()
    trainer = GRPOTrainer(model, even, train_dataset=prompts(8), eval_dataset=prompts(6), callbacks=[recorder],
                          args=config(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2,
                                      eval_on_start=True, per_device_eval_batch_size=4))
    trainer.train()
    evaluations = [h for h in trainer.state.log_history if "eval_accuracy" in h]
    assert [h["step"] for h in evaluations] == [0, 2, 4]
    assert all(h["eval_accuracy"] == pytest.approx(0.5) for h in evaluations)  # the reward ignores the text
    assert {"eval_reward", "eval_completion_length"} <= set(evaluations[0]) and "eval_loss" not in evaluations[0]
    eval_samples = [s for kw in recorder.of("samples") for s in kw["samples"] if s["split"] == "eval"]
    assert len(eval_samples) == 18 and {s["sample_index"] for s in eval_samples} == {0}


def test_a_nonfinite_loss_is_counted_in_the_logs(tmp_path, tiny_model_dir):
    calls = []

    def nan_on_second_step(completions, **kw):
        calls.append(1)
        # inf, not NaN: a NaN reward means "not scored", as in TRL (tests/a2po/test_reward_calls.py)
        return [math.inf if len(calls) == 2 else float(i % 2) for i in range(len(completions))]

    trainer = GRPOTrainer(tiny_model_dir, nan_on_second_step, args=config(tmp_path, max_steps=3),
                          train_dataset=prompts(8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["frac_nonfinite_loss"] for h in logged][:2] == [0.0, 1.0]
    assert math.isfinite(logged[1]["loss"])  # what the Trainer's logging_nan_inf_filter shows instead


def test_too_few_prompts_for_one_step_is_a_clear_error(tmp_path, tiny_model_dir):
    trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, per_device_train_batch_size=8),
                          train_dataset=prompts(3))
    with pytest.raises(ValueError, match="trains on 4 prompts"):
        trainer.train()


def test_truncated_completions_can_be_left_out_of_the_loss(tmp_path, tiny_model_dir):
    """`mask_truncated_completions`: a completion with no EOS within max_completion_length counts in no loss
    normaliser and gets no gradient; it still attends as it was sampled."""
    from a2po.base_trainer import Rollout

    trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, mask_truncated_completions=True))
    rows = [{**row, "prompt_id": str(i)} for i, row in enumerate(prompts(2).to_list())]
    prompt_ids, prompt_mask, texts = trainer._encode_prompts([row["prompt"] for row in rows])
    tok = trainer.processing_class
    a, end, pad = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("<|end|>"), trainer.pad_token_id
    completion_ids = torch.tensor([[a, end, pad], [a, a, a], [end, pad, pad], [a, a, a]])
    completions, mask = trainer._decode(completion_ids)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    clipped = ~torch.isin(completion_ids, torch.tensor(trainer.eos_token_ids)).any(-1)
    rollout = Rollout(rows, prompt_ids, prompt_mask, texts, completion_ids, mask, completions, rewards,
                      rewards[:, None], clipped, 2)
    [batch] = trainer._prepare_generation(trainer.model, rollout)
    assert batch["loss_mask"].tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]
    assert batch["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert float(batch["num_items"]) == 3.0


@pytest.mark.slow
def test_two_processes_train_as_one_process_with_their_joint_batch(tmp_path, tiny_model_dir):
    """Under DDP each process samples whole groups for its share of the step's prompts: 2 processes x 2 completions
    per micro-batch train on the prompts, samples and losses of 1 process x 4, and each saves its own generation."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "distributed_grpo_script.py"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    alone = subprocess.run([sys.executable, str(script), tiny_model_dir, str(tmp_path / "one"), "4"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    both = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script),
                           tiny_model_dir, str(tmp_path / "two"), "2"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert both.returncode == 0, both.stderr[-4000:]
    one = json.loads((tmp_path / "one" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert one["prompts_per_step"] == ranks[0]["prompts_per_step"] == 2
    for report in ranks:
        assert report["losses"] == pytest.approx(one["losses"], abs=1e-5)
        assert report["completion_tokens"] == one["completion_tokens"]
        assert {"generation_buffer.rank0.pt", "generation_buffer.rank1.pt"} <= set(report["checkpoint"])
    assert "generation_buffer.pt" in one["checkpoint"]


def test_remove_unused_columns_keeps_the_prompts(tmp_path, tiny_model_dir):
    trainer = GRPOTrainer(tiny_model_dir, coin, args=config(tmp_path, remove_unused_columns=True, max_steps=1),
                          train_dataset=prompts(4))
    assert trainer.train().global_step == 1


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_the_kl_is_zero_before_the_first_update_in_every_precision(tmp_path, tiny_model_dir, bf16, lora):
    """The reference computes in the policy's precision (with bf16, bf16 autocast on the CPU here): before any
    update the KL term is 0, where a bf16 copy of the reference beside an fp32 policy was not."""
    from peft import LoraConfig

    trainer = GRPOTrainer(tiny_model_dir, coin, train_dataset=prompts(4),
                          args=config(tmp_path, bf16=bf16, beta=0.04, max_steps=1, max_completion_length=16,
                                      temperature=0.7),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if lora else None)
    trainer.train()
    assert [h["kl"] for h in trainer.state.log_history if "loss" in h] == [pytest.approx(0.0, abs=1e-7)]
