"""vLLM as the sampler (`use_vllm`), on vLLM's CPU build: both methods end to end, weights that match the trainer's,
greedy answers equal to the native decoder's, a resume that pushes the restored weights before sampling, GRPO's
importance-sampling correction (TRL's metrics), and GRPO's gradient accumulation under vLLM's transformers.

Runs in its own virtualenv (`make test-vllm`). Every trainer here uses one tiny model config, so the module shares
one engine (`a2po.vllm_engine.engine_for`). vLLM's CPU attention needs a head size of 32 or more: 2 heads of 32.
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402

from a2po import A2POConfig, A2POTrainer, GRPOConfig, GRPOTrainer, vllm_engine  # noqa: E402
from a2po.rollout import sequence_logprobs  # noqa: E402
from a2po.testing import make_tiny_model  # noqa: E402

# fp32 both sides: the same weights give the same log-probabilities up to the order of float additions.
LOGPROB_TOLERANCE = 1e-4  # nats, on a sequence's summed log-probability


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-vllm")
    make_tiny_model(path, num_heads=2, num_kv_heads=1)
    return str(path)


def prompts(n=8):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i} + {i} ="}], "ground_truth": str(2 * i)}
                              for i in range(n)])


def coin(completions, **kwargs):
    """A reward that depends on the sampled text, so some samples of every prompt score 1."""
    return [float(sum(map(ord, c[0]["content"])) % 2 == 0) for c in completions]


# One vllm_max_model_length for all: equal engine settings, so every trainer here shares the module's one engine.
COMMON = dict(max_completion_length=6, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
              learning_rate=1e-2, seed=0, disable_tqdm=True, use_vllm=True, vllm_max_model_length=256)


def a2po_config(tmp_path, **overrides):
    return A2POConfig(**{**COMMON, "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4,
                         "max_steps": 2, "num_value_samples": 4, "filter_all_incorrect": False, **overrides})


def grpo_config(tmp_path, **overrides):
    return GRPOConfig(**{**COMMON, "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4,
                         "num_generations": 2, "max_steps": 2, "gradient_checkpointing": False, **overrides})


class EngineLog:
    """Records what the module's engine is asked, in order: ("load", role, step, weights) and ("generate", rows)."""

    def __init__(self, monkeypatch):
        self.events = []
        engine_class = vllm_engine.VLLMEngine
        load, generate = engine_class.load_weights, engine_class.generate

        def spy_load(engine, weights, key):
            weights = [(name, tensor.clone()) for name, tensor in weights]
            self.events.append(("load", key[1], key[2], dict(weights)))
            return load(engine, iter(weights), key)

        def spy_generate(engine, prompts, **kwargs):
            out = generate(engine, prompts, **kwargs)
            self.events.append(("generate", out[0].shape[0]))
            return out

        monkeypatch.setattr(engine_class, "load_weights", spy_load)
        monkeypatch.setattr(engine_class, "generate", spy_generate)

    def loads(self):
        return [(event[1], event[2]) for event in self.events if event[0] == "load"]

    def kinds(self):
        return [event[0] for event in self.events]


def test_a2po_and_grpo_train_end_to_end_with_vllm(tmp_path, model_dir, monkeypatch):
    """Stage 1 from the reference's weights, then each step's rollouts from the policy of that step: a push after
    every optimizer step, and none between samplings of one set of weights."""
    log = EngineLog(monkeypatch)
    a2po = A2POTrainer(model_dir, coin, args=a2po_config(tmp_path / "a2po", max_steps=3), train_dataset=prompts(8),
                       eval_dataset=prompts(3))
    a2po.train()
    assert log.loads() == [("reference", None), ("policy", 0), ("policy", 1), ("policy", 2)]
    assert log.kinds().count("generate") == 1 + 3  # one stage-1 decode of 8 x 4, one rollout per step
    assert a2po.rollout_stats["values"]["sequences"] == 32 and a2po.rollout_stats["train"]["sequences"] == 12
    # Evaluation: the eval set's stage 1 from the reference, then a greedy and a sampled answer per prompt.
    metrics = a2po.evaluate()
    assert log.loads()[4:] == [("reference", None), ("policy", 3)]
    assert a2po.rollout_stats["eval"]["sequences"] == 3 * 2 and 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert all(h["completion_length"] > 0 for h in a2po.state.log_history if "loss" in h)

    log.events.clear()
    grpo = GRPOTrainer(model_dir, coin, args=grpo_config(tmp_path / "grpo"), train_dataset=prompts(8),
                       eval_dataset=prompts(3))
    grpo.train()
    metrics = grpo.evaluate()
    assert log.loads() == [("policy", 0), ("policy", 1), ("policy", 2)]
    assert grpo.rollout_stats["train"]["sequences"] == 2 * 4 and 0.0 <= metrics["eval_accuracy"] <= 1.0


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_after_a_push_vllm_scores_a_completion_as_the_trainer_does(tmp_path, model_dir, lora):
    """One optimizer step, the policy's weights pushed (LoRA: merged); vLLM's log-probability of a fixed completion
    (its prompt log-probabilities) equals the trainer's forward pass in fp32, and differs from the initial model's.
    With LoRA the training model keeps its adapters unmerged, and stage 1 got the base weights."""
    from peft import LoraConfig
    from vllm import SamplingParams

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if lora else None
    trainer = A2POTrainer(model_dir, coin, args=a2po_config(tmp_path, max_steps=1, learning_rate=5e-2),
                          train_dataset=prompts(4), peft_config=peft_config)
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model)
    prompt_ids, prompt_mask, _ = trainer._encode_prompts([prompts(1)[0]["prompt"]])
    completion = trainer.processing_class("12<|end|>", add_special_tokens=False, return_tensors="pt").input_ids
    mask = torch.ones_like(completion)

    def vllm_logprob(phase):
        engine = trainer._vllm_for(policy, phase, None)
        prompt = prompt_ids[0].tolist()
        [output] = engine.llm.generate([{"prompt_token_ids": prompt + completion[0].tolist()}],
                                       SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
                                       use_tqdm=False)
        return sum(output.prompt_logprobs[len(prompt) + t][token].logprob
                   for t, token in enumerate(completion[0].tolist()))

    with torch.no_grad():
        trainers = sequence_logprobs(policy, prompt_ids, prompt_mask, completion, mask).item()
        initial = sequence_logprobs(AutoModelForCausalLM.from_pretrained(model_dir), prompt_ids, prompt_mask,
                                    completion, mask).item()
    assert vllm_logprob("train") == pytest.approx(trainers, abs=LOGPROB_TOLERANCE)
    assert abs(initial - trainers) > 100 * LOGPROB_TOLERANCE  # the step changed the policy: the push is seen
    if lora:
        assert not any(getattr(module, "merged", False) for module in policy.modules())
        with policy.disable_adapter():  # the reference, as stage 1 pushes it: the base weights alone
            assert vllm_logprob("values") == pytest.approx(initial, abs=LOGPROB_TOLERANCE)


def test_greedy_evaluation_answers_equal_the_native_decoders(tmp_path, model_dir):
    class Answers(TrainerCallback):
        def __init__(self):
            self.answers = []

        def on_samples(self, args, state, control, samples=None, **kwargs):
            self.answers += [(s["prompt_id"], s["completion"]) for s in samples if s["split"] == "eval"]

    answers = {}
    for use_vllm in (False, True):
        recorder = Answers()
        trainer = GRPOTrainer(model_dir, coin, args=grpo_config(tmp_path / str(use_vllm), use_vllm=use_vllm,
                                                                max_completion_length=24),
                              eval_dataset=prompts(6), callbacks=[recorder])
        trainer.evaluate()
        answers[use_vllm] = sorted(recorder.answers)
    assert len(answers[True]) == 6 and any(completion for _, completion in answers[True])
    assert answers[True] == answers[False]


def test_a_resumed_run_pushes_its_restored_weights_before_sampling(tmp_path, model_dir, monkeypatch):
    """A run stopped at step 2 is resumed from its checkpoint while the process's engine holds another run's
    policy of step 2: the resumed run pushes the checkpoint's weights before its first rollout."""
    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    settings = dict(max_steps=4, save_strategy="steps", save_steps=2)
    first = A2POTrainer(model_dir, coin, args=a2po_config(tmp_path, **settings), train_dataset=prompts(8),
                        callbacks=[StopAt()])
    first.train()
    # Another run leaves the engine at step 2 too, with other weights: only the trainer in the key tells them apart.
    A2POTrainer(model_dir, coin, args=a2po_config(tmp_path / "other", max_steps=3), train_dataset=prompts(8)).train()
    log = EngineLog(monkeypatch)
    checkpoint = tmp_path / "out" / "checkpoint-2"
    resumed = A2POTrainer(model_dir, coin, args=a2po_config(tmp_path, **settings), train_dataset=prompts(8))
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert log.kinds()[:2] == ["load", "generate"]  # stage 1 was read from the saved V* table: no reference push
    _, role, step, pushed = log.events[0]
    restored = AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()
    assert (role, step) == ("policy", 2)
    assert all(torch.equal(pushed[name], tensor) for name, tensor in restored.items() if name in pushed)
    assert set(restored) <= set(pushed)


IS_METRICS = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
              "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
              "sampling/importance_sampling_ratio/max")


def test_grpo_corrects_for_vllms_sampling_distribution_and_logs_trls_metrics(tmp_path, model_dir):
    """vLLM returns each sampled token's log-probability after temperature; in fp32 the trainer's own equal them, so
    TRL's metrics log a difference near 0 and weights near 1. Without the correction there are neither."""
    trainer = GRPOTrainer(model_dir, coin, args=grpo_config(tmp_path / "on", temperature=0.7),
                          train_dataset=prompts(8))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for log in logs:
        assert 0 <= log["sampling/sampling_logp_difference/mean"] <= log["sampling/sampling_logp_difference/max"]
        assert log["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE
        for name in IS_METRICS[2:]:
            assert log[name] == pytest.approx(1.0, abs=LOGPROB_TOLERANCE * 10), name
    [batch, *_] = trainer._buffer
    mask = batch["loss_mask"].bool()
    assert mask.any() and torch.allclose(batch["sampling_logps"][mask], batch["old_logps"][mask],
                                         atol=LOGPROB_TOLERANCE)
    assert batch["sampling_weights"].shape == (len(mask), 1)  # "sequence_mask", TRL's default: one per completion

    plain = GRPOTrainer(model_dir, coin, args=grpo_config(tmp_path / "off", vllm_importance_sampling_correction=False),
                        train_dataset=prompts(8))
    plain.train()
    assert not any(name in h for h in plain.state.log_history for name in IS_METRICS)
    assert "sampling_weights" not in plain._buffer[0] and "old_logps" not in plain._buffer[0]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_grpo_gradient_accumulation_gives_the_same_update_as_one_batch(tmp_path, model_dir, loss_type):
    """Under the transformers vLLM pins (5.17: no `loss_is_scaled_for_ga`), an optimizer step of 2 x 2 completions
    with accumulation updates the policy as one batch of 4 does (the samples are the same: each is seeded by its
    own key), with the importance-sampling weights in the loss."""
    def trained(batch, accumulation):
        args = grpo_config(tmp_path / f"{batch}x{accumulation}", per_device_train_batch_size=batch,
                           gradient_accumulation_steps=accumulation, max_steps=1, optim="sgd", learning_rate=0.5,
                           max_grad_norm=1e9, lr_scheduler_type="constant", loss_type=loss_type,
                           shuffle_dataset=False)
        trainer = GRPOTrainer(model_dir, coin, args=args, train_dataset=prompts(8))
        trainer.train()
        [log] = [h for h in trainer.state.log_history if "loss" in h]
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, log

    (one_batch, log), (accumulated, accumulated_log) = trained(4, 1), trained(2, 2)
    initial = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    assert any(not torch.allclose(one_batch[n], initial[n].detach()) for n in one_batch)
    assert accumulated_log["loss"] == pytest.approx(log["loss"], abs=1e-6)
    assert accumulated_log["grad_norm"] == pytest.approx(log["grad_norm"], rel=1e-4)
    for name in one_batch:
        assert torch.allclose(one_batch[name], accumulated[name], atol=1e-5), name


def test_one_engine_served_the_module():
    assert vllm_engine.VLLMEngine.started == 1


def test_sleep_mode_is_refused_where_vllm_has_none(model_dir):
    settings = vllm_engine.EngineSettings(model=model_dir, dtype="float32", options=(
        ("enable_sleep_mode", True), ("gpu_memory_utilization", 0.3), ("max_model_len", None), ("model_impl", "vllm"),
        ("tensor_parallel_size", 1)))
    if torch.cuda.is_available():
        pytest.skip("a GPU has sleep mode")
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode needs a GPU"):
        vllm_engine.VLLMEngine(settings)
