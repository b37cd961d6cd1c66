"""GRPO against TRL 1.16.0's `GRPOTrainer`: for the same prompts, completions and rewards, the same advantages,
log-probabilities, loss, gradients and metrics (fp32, CPU, the tiny model), for every offered `loss_type`, with
`beta` 0 and > 0 and `num_iterations` 1 and 2; for each of TRL's other switches of the loss and the advantages
(GSPO's sequence-level ratio, two-sided clipping, the off-policy mask, high-entropy tokens, GDPO); and, for
completions whose sampling log-probabilities are given (as vLLM returns them), the same importance-sampling
correction in each `vllm_importance_sampling_mode`.

TRL's side is TRL's own code on a TRL `GRPOTrainer` built on the same model files: its
`_generate_and_score_completions` (with generation replaced by the fixed completions, so both score the same
tokens) and its `_compute_loss`. Before sampling, both policies are moved away from the reference (so the KL term is
not 0); with `num_iterations` 2 they are moved again after sampling, as an optimizer step would, so the ratio to the
sampling policy is not 1 and the epsilon / epsilon_high clipping bites. The prompts have one length: TRL's forward
counts positions from the left padding, ours from the first real token (as decoding does).
"""

import math
import re

import pytest
import torch
from datasets import Dataset

from a2po import GRPOConfig, GRPOTrainer
from a2po.base_trainer import Rollout
from a2po.core import group_advantages
from a2po.rollout import per_token_logprobs
from a2po.settings import GRPO_LOSS_TYPES

trl = pytest.importorskip("trl", reason="TRL is the `bench` extra (`make test` installs it)")
if trl.__version__ != "1.16.0":
    pytest.skip(f"parity is pinned to TRL 1.16.0 (found {trl.__version__})", allow_module_level=True)

PROMPTS, G, T = 3, 4, 7
REWARDS = [1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0]  # a mixed group, an all-equal group (zero advantage), one correct
LENGTHS = [3, 7, 5, 7, 2, 6, 7, 4, 1, 7, 5, 3]


# A second reward function for GDPO: graded, and not applying to two completions (None).
SECOND = [0.5, 1.0, 0.0, None, 0.25, 0.75, 0.0, 1.0, None, 0.5, 0.5, 0.5]


def fixed_rewards(completions, **kwargs):
    return [float(r) for r in REWARDS]


def second_rewards(completions, **kwargs):
    return list(SECOND)


def completion_lists(tokenizer):
    """Token ids per completion: most end with an EOS (either of the two), some run to T tokens without one."""
    generator = torch.Generator().manual_seed(0)
    end, eos = tokenizer.convert_tokens_to_ids("<|end|>"), tokenizer.eos_token_id
    out = []
    for k, n in enumerate(LENGTHS):
        ids = torch.randint(10, len(tokenizer), (n,), generator=generator).tolist()
        if n < T or k % 3 == 0:
            ids[-1] = end if k % 2 else eos
        out.append(ids)
    return out


def move(model, seed, scale=0.02):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=generator) * scale)


ROWS = [{"prompt": [{"role": "user", "content": f"{i} + {i} ="}], "prompt_id": f"p{i}"} for i in range(PROMPTS)]


def trainers(tmp_path, model_dir, reward_funcs=fixed_rewards, **overrides):
    """Our trainer and TRL's on the same model and settings, both policies moved away from the reference."""
    settings = dict(per_device_train_batch_size=PROMPTS * G, num_generations=G, max_completion_length=T,
                    epsilon=0.2, epsilon_high=0.28, temperature=0.7, use_cpu=True, bf16=False,
                    gradient_checkpointing=False, report_to="none", save_strategy="no", disable_tqdm=True)
    settings.update(overrides)
    ours = GRPOTrainer(model_dir, reward_funcs, args=GRPOConfig(output_dir=str(tmp_path / "ours"), **settings),
                       train_dataset=Dataset.from_list(ROWS))
    theirs = trl.GRPOTrainer(model_dir, reward_funcs,
                             args=trl.GRPOConfig(output_dir=str(tmp_path / "trl"), **settings),
                             train_dataset=Dataset.from_list(ROWS), processing_class=ours.processing_class)
    for trainer in (ours, theirs):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        move(trainer.model, seed=1)  # the policy is no longer the reference
    return ours, theirs


def completion_rollout(trainer, completions, sampling_logps=None):
    """The fixed completions as a rollout of our engine (padded after the EOS, as the sampler leaves them), scored
    by the trainer's reward functions."""
    prompt_ids, prompt_mask, texts = trainer._encode_prompts([row["prompt"] for row in ROWS])
    completion_ids = torch.full((PROMPTS * G, T), trainer.pad_token_id)
    for k, ids in enumerate(completions):
        completion_ids[k, :len(ids)] = torch.tensor(ids)
    decoded, mask = trainer._decode(completion_ids)
    per_func = torch.tensor([[math.nan if v is None else float(v) for v in func(decoded)]
                             for func in trainer.reward_funcs], dtype=torch.float64).T
    rewards = (per_func * trainer.reward_weights).nansum(dim=1)
    clipped = ~torch.isin(completion_ids, torch.tensor(trainer.eos_token_ids)).any(-1)
    return Rollout(ROWS, prompt_ids, prompt_mask, texts, completion_ids, mask, decoded, rewards, per_func,
                   clipped, G, sampling_logps)


def trl_generation(trainer, completions, sampling_logps=None):
    """TRL's scoring, advantages and log-probs, on the fixed completions instead of sampled ones (with their
    sampling log-probs as vLLM would return them)."""
    logprobs = None if sampling_logps is None else [row[:len(ids)].tolist()
                                                    for row, ids in zip(sampling_logps, completions)]
    trainer._generate_single_turn = lambda *args, **kwargs: ([list(ids) for ids in completions], logprobs)
    return trainer._generate_and_score_completions([dict(row) for row in ROWS for _ in range(G)])


def assert_same_loss_and_gradients(ours, theirs, batch, trl_inputs):
    our_loss = ours._policy_loss(ours.model, batch)
    trl_loss = theirs._compute_loss(theirs.model, trl_inputs)
    our_loss.backward()
    trl_loss.backward()
    assert our_loss.item() == pytest.approx(trl_loss.item(), abs=1e-5)
    trl_params = dict(theirs.model.named_parameters())
    for name, p in ours.model.named_parameters():
        assert torch.allclose(p.grad, trl_params[name].grad, atol=1e-5), name
    assert any(p.grad.abs().max() > 1e-3 for p in ours.model.parameters())


@pytest.mark.parametrize("num_iterations", [1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_loss_and_gradients_equal_trl(tmp_path, tiny_model_dir, loss_type, beta, num_iterations):
    ours, theirs = trainers(tmp_path, tiny_model_dir, loss_type=loss_type, beta=beta, num_iterations=num_iterations)
    completions = completion_lists(ours.processing_class)
    trl_inputs = trl_generation(theirs, completions)
    rollout = completion_rollout(ours, completions)
    mask = rollout.completion_mask
    [batch] = ours._prepare_generation(ours.model, rollout)

    assert torch.equal(batch["prompt_ids"], trl_inputs["prompt_ids"])
    assert torch.equal(batch["completion_mask"], trl_inputs["completion_mask"])
    assert torch.allclose(batch["advantages"], trl_inputs["advantages"], atol=1e-6)
    assert float(batch["num_items"]) == float(trl_inputs["num_items_in_batch"])
    if num_iterations > 1:
        assert torch.allclose(batch["old_logps"] * mask, trl_inputs["old_per_token_logps"] * mask, atol=1e-5)
        for trainer in (ours, theirs):
            move(trainer.model, seed=2)  # an optimizer step between sampling and this loss
    if beta:
        assert torch.allclose(batch["ref_logps"] * mask, trl_inputs["ref_per_token_logps"] * mask, atol=1e-5)

    assert_same_loss_and_gradients(ours, theirs, batch, trl_inputs)

    trl_metrics = theirs._metrics["train"]
    names = ["frac_reward_zero_std", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
             "clip_ratio/low_min", "clip_ratio/high_max"] + (["kl"] if beta else [])
    for name in names:
        assert ours._metrics[name] == pytest.approx(trl_metrics[name], abs=1e-5), name
    assert ours._metrics["frac_reward_zero_std"] == [pytest.approx(1 / 3)]
    if num_iterations > 1:
        assert ours._metrics["clip_ratio/region_mean"][0] > 0  # the clipping was exercised
    if beta:
        assert ours._metrics["kl"][0] > 1e-4


# Each of TRL's other switches, with the setting that leaves it out (where there is one): the test checks that the
# switch changed the loss, so that the parity is not that of two losses without it.
VARIANTS = {
    "cispo": (dict(loss_type="cispo", epsilon_high=1.0), None),  # epsilon_high caps the ratio itself
    "sapo": (dict(loss_type="sapo", sapo_temperature_pos=1.5, sapo_temperature_neg=0.8), None),
    "luspo": (dict(loss_type="luspo", importance_sampling_level="sequence"), None),
    "vespo": (dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_neg=2.5), None),
    "gspo": (dict(loss_type="grpo", importance_sampling_level="sequence"), dict(importance_sampling_level="token")),
    "two_sided_clip": (dict(loss_type="dapo", delta=1.05), dict(delta=None)),
    "off_policy_mask": (dict(loss_type="bnpo", off_policy_mask_threshold=0.005), dict(off_policy_mask_threshold=None)),
    "top_entropy": (dict(loss_type="dapo", top_entropy_quantile=0.2), dict(top_entropy_quantile=1.0)),
    "top_entropy_sapo": (dict(loss_type="sapo", top_entropy_quantile=0.5), dict(top_entropy_quantile=1.0)),
    "gdpo": (dict(multi_objective_aggregation="normalize_then_sum", reward_weights=[1.0, 0.5]), None),
}
LOSS_METRICS = {"cispo": ["cispo_clip_ratio"], "sapo": [], "vespo": ["vespo/phi_seq_mean"]}
CLIP_METRICS = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
                "clip_ratio/high_max"]


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loss_variants_equal_trl(tmp_path, tiny_model_dir, variant, beta):
    """Off-policy (num_iterations 2, the policy moved after sampling), where every switch acts: the same advantages,
    loss, gradients and metrics as TRL's, and the switch changes the loss."""
    settings, without = VARIANTS[variant]
    funcs = [fixed_rewards, second_rewards] if variant == "gdpo" else fixed_rewards
    ours, theirs = trainers(tmp_path, tiny_model_dir, reward_funcs=funcs, beta=beta, num_iterations=2, **settings)
    completions = completion_lists(ours.processing_class)
    trl_inputs = trl_generation(theirs, completions)
    rollout = completion_rollout(ours, completions)
    [batch] = ours._prepare_generation(ours.model, rollout)
    assert torch.allclose(batch["advantages"], trl_inputs["advantages"], atol=1e-5)
    if variant == "gdpo":  # each reward normalized in its group first: not the advantages of the summed reward
        summed, _ = group_advantages(rollout.rewards, G, "group")
        assert not torch.allclose(batch["advantages"], summed.float(), atol=1e-2)
    for trainer in (ours, theirs):
        move(trainer.model, seed=2)  # an optimizer step between sampling and this loss

    assert_same_loss_and_gradients(ours, theirs, batch, trl_inputs)

    loss_type = ours.args.loss_type
    names = ["frac_reward_zero_std", *LOSS_METRICS.get(loss_type, CLIP_METRICS)] + (["kl"] if beta else [])
    if ours.args.top_entropy_quantile < 1.0:
        names.append("entropy")  # computed only then (TRL always computes it)
    trl_metrics = theirs._metrics["train"]
    for name in names:
        assert ours._metrics[name] == pytest.approx(trl_metrics[name], abs=1e-5), name
    offered = {name for name in trl_metrics if name.startswith(("clip_ratio", "cispo", "vespo"))}
    assert offered == {name for name in ours._metrics if name.startswith(("clip_ratio", "cispo", "vespo"))}
    if loss_type == "cispo":
        assert 0 < ours._metrics["cispo_clip_ratio"][0] < 1  # the cap bit on some tokens, not all
    if loss_type == "vespo":
        assert ours._metrics["vespo/phi_seq_mean"][0] != pytest.approx(1.0, abs=1e-3)
    if without is not None:
        with torch.no_grad():
            with_switch = ours._policy_loss(ours.model, batch).item()
            for name, value in without.items():
                setattr(ours.args, name, value)
            assert abs(ours._policy_loss(ours.model, batch).item() - with_switch) > 1e-5


def test_loss_types_offered_are_trls(tmp_path):
    """Every loss_type TRL 1.16 supports is offered, and no other."""
    help_text = trl.GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = help_text.split("Supported values are ")[1].split(".")[0]
    assert sorted(re.findall(r"'(\w+)'", supported)) == sorted(GRPO_LOSS_TYPES)


IS_METRICS = ["sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
              "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
              "sampling/importance_sampling_ratio/max"]


MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


@pytest.mark.parametrize("mode, loss_type, beta, extra", [
    *[(mode, loss_type, beta, {}) for mode in MODES for loss_type, beta in [("dapo", 0.0), ("grpo", 0.04)]],
    # VESPO takes vLLM's per-token weights into its sequence weight (TRL allows only the token modes)
    ("token_truncate", "vespo", 0.0, {}), ("token_mask", "vespo", 0.04, {}),
    # the off-policy mask measures the divergence from vLLM's log-probs
    ("sequence_mask", "dapo", 0.0, {"off_policy_mask_threshold": 0.05}),
])
def test_vllm_importance_sampling_correction_equals_trl(tmp_path, tiny_model_dir, mode, loss_type, beta, extra):
    """Completions with sampling log-probabilities off the policy's by up to a nat (and one vLLM did not score, NaN):
    the same weights pi_old / pi_vllm, loss, gradients and metrics as TRL's with `use_vllm` (TRL's vLLM engine is
    not needed: its generation is replaced by the fixed completions and their log-probs). Both bounds bite."""
    clip = dict(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=0.5,
                vllm_importance_sampling_clip_max=2.0)
    ours, theirs = trainers(tmp_path, tiny_model_dir, loss_type=loss_type, beta=beta, **clip, **extra)
    theirs.use_vllm = True  # after construction: no vLLM engine here, and none is asked for
    completions = completion_lists(ours.processing_class)
    rollout = completion_rollout(ours, completions)
    with torch.no_grad():
        policy_logps = per_token_logprobs(ours.model, rollout.prompt_ids.repeat_interleave(G, 0),
                                          rollout.prompt_mask.repeat_interleave(G, 0), rollout.completion_ids,
                                          rollout.completion_mask, temperature=0.7)
    noise = (torch.randn(policy_logps.shape, generator=torch.Generator().manual_seed(3)) * 0.4).clamp(-1, 1)
    noise[0], noise[2] = -1.0, 1.0  # a completion vLLM found less likely than the policy does, one more likely
    sampling_logps = (policy_logps + noise) * rollout.completion_mask
    sampling_logps[4, 0] = float("nan")
    rollout.sampling_logps = sampling_logps

    trl_inputs = trl_generation(theirs, completions, sampling_logps)
    [batch] = ours._prepare_generation(ours.model, rollout)
    weights = batch["sampling_weights"]
    assert weights.shape == trl_inputs["importance_sampling_ratio"].shape
    assert torch.allclose(weights, trl_inputs["importance_sampling_ratio"], atol=1e-5)
    counted = weights.flatten() if mode.startswith("sequence") else weights[rollout.completion_mask.bool()]
    if mode.endswith("mask"):
        assert (counted == 0).any() and (counted > 1).any() and (counted[counted > 0] >= 0.5).all()
    else:
        assert (counted == 0.5).any() and (counted == 2.0).any()
    assert_same_loss_and_gradients(ours, theirs, batch, trl_inputs)
    trl_metrics = theirs._metrics["train"]
    for name in IS_METRICS:
        assert ours._metrics[name] == pytest.approx(trl_metrics[name], abs=1e-5), name
    assert 0 < ours._metrics["sampling/sampling_logp_difference/mean"][0] <= 1.0 + 1e-5


def test_config_defaults_are_trls(tmp_path):
    """The offered fields default as TRL's (bf16 aside: as A2POConfig, on only where the GPU supports it)."""
    ours, theirs = GRPOConfig(output_dir=str(tmp_path), use_cpu=True), trl.GRPOConfig(output_dir=str(tmp_path),
                                                                                          use_cpu=True)
    for name in ("num_generations", "beta", "loss_type", "scale_rewards", "epsilon", "epsilon_high", "num_iterations",
                 "max_completion_length", "temperature", "top_p", "top_k", "learning_rate", "logging_steps",
                 "gradient_checkpointing", "mask_truncated_completions", "shuffle_dataset", "remove_unused_columns",
                 "use_bias_correction_kl", "reward_weights", "model_init_kwargs", "trust_remote_code",
                 "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
                 "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
                 "vllm_importance_sampling_cap", "delta", "sapo_temperature_neg", "sapo_temperature_pos",
                 "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "importance_sampling_level",
                 "multi_objective_aggregation", "top_entropy_quantile", "off_policy_mask_threshold"):
        assert getattr(ours, name) == getattr(theirs, name), name
