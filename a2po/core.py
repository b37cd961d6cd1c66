r"""The math, in one place: A*-PO, and GRPO beside it.

Stage 1 (offline, reference policy pi_ref, N samples y_1..y_N per prompt x, binary rewards r_i):

    V*(x) = beta1 * log( (1/N) * sum_i exp(r_i / beta1) )
          = beta1 * ( logsumexp_i(r_i / beta1) - log N )

It is a soft maximum of the rewards: 0 when no sample is correct, 1 when all are, and it rises quickly with the
first correct samples (N=8, beta1=0.5: 0, 1, 2, 4, 8 correct give 0, 0.2935, 0.4772, 0.7169, 1.0).

Stage 2 (on-policy, one sample y ~ pi(.|x) per prompt):

    log_ratio(x, y) = sum_t log pi(y_t | x, y_<t) - sum_t log pi_ref(y_t | x, y_<t)
    loss = mean_x ( beta2 * log_ratio(x, y) - (r(x, y) - V*(x)) )^2

summed over the completion tokens up to and including the first end-of-sequence token. beta2 * log_ratio is the
implicit reward, r - V* the optimal-advantage estimate.

GRPO, for comparison (`GRPOTrainer`; G samples y_1..y_G per prompt from the current policy, every step):

    A_i = (r_i - mean_j r_j) / (std_j r_j + 1e-4)            (`group_advantages`)
    loss = -mean over tokens of min(ratio_t * A_i, clip(ratio_t, 1 - eps, 1 + eps_high) * A_i) + beta * KL_t

with ratio_t = pi(y_t) / pi_old(y_t) (`grpo_loss`). Each of TRL 1.16's loss types is an entry of `LOSS_TYPES`: its
policy term (the clipped surrogate above, or CISPO's, SAPO's, VESPO's), its aggregation over tokens (the mean above
is one of several) and the statistics it logs. `grpo_loss` also holds GSPO's sequence-level ratio, two-sided clipping,
off-policy sequence masking and high-entropy token selection; `decoupled_advantages` is GDPO's. Where A*-PO
samples once per prompt per step and regresses onto a target fixed before training, GRPO samples G times per prompt
per step and compares the G samples with each other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from a2po.settings import IMPORTANCE_SAMPLING_LEVELS, VLLM_IS_MODES, config_default


def optimal_value(rewards: torch.Tensor, beta1: float) -> torch.Tensor:
    """V* per prompt from rewards of shape (num_prompts, N): beta1 * (logsumexp(r / beta1) - log N)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    n = rewards.shape[-1]
    return beta1 * (torch.logsumexp(rewards / beta1, dim=-1) - math.log(n))


def completion_mask(completion_ids: torch.Tensor, eos_token_ids: Iterable[int]) -> torch.Tensor:
    """1 for completion tokens up to and including the first EOS of each row, 0 after it.

    `completion_ids` is (batch, T); any id in `eos_token_ids` ends a completion (chat models have several).
    """
    eos = torch.zeros_like(completion_ids, dtype=torch.bool)
    for token_id in eos_token_ids:
        eos |= completion_ids == token_id
    # Tokens strictly after the first EOS have a positive count of EOS before them.
    eos_before = torch.cumsum(eos.int(), dim=1) - eos.int()
    return (eos_before == 0).long()


class _SelectiveLogSoftmax(torch.autograd.Function):
    """log softmax(logits)[token], computed and differentiated chunk by chunk.

    Only the per-position log-sum-exp is kept for the backward pass (the logits are the model's output, alive
    anyway); the softmax is recomputed one chunk at a time there, using d logp_t / d logit_j = [j = t] - p_j.
    So neither pass holds a float32 copy of all the logits: at a large vocabulary this keeps about half of what
    autograd through the chunks keeps alive for the backward pass (figures: docs/benchmarks.md, "Design figures").
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, chunk_size: int) -> torch.Tensor:
        picked = torch.empty(tokens.shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(picked)
        for start in range(0, logits.shape[0], chunk_size):
            chunk = logits[start:start + chunk_size].float()
            lse[start:start + chunk_size] = torch.logsumexp(chunk, dim=-1)
            picked[start:start + chunk_size] = chunk.gather(-1, tokens[start:start + chunk_size, None]).squeeze(-1)
        ctx.save_for_backward(logits, tokens, lse)
        ctx.chunk_size = chunk_size
        return picked - lse

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, tokens, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            end = start + ctx.chunk_size
            g = grad_output[start:end, None].float()
            chunk_grad = (logits[start:end].float() - lse[start:end, None]).exp_().mul_(-g)
            chunk_grad.scatter_add_(-1, tokens[start:end, None], g)
            grad[start:end] = chunk_grad.to(grad.dtype)
        return grad, None, None


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits)[token] per position, without materialising the full (batch, T, vocab) log-softmax.

    logits: (batch, T, vocab) for the positions that predict `tokens` (batch, T); float32 result. Positions are
    processed in chunks, forward and backward (see `_SelectiveLogSoftmax`); by default a chunk holds 2**24 logits
    (64 MiB in float32: 110 positions at a 152k vocabulary), which keeps a long bf16 log-prob pass at that vocabulary
    well below what 1024-position chunks need (figures: docs/benchmarks.md, "Design figures").
    """
    if chunk_size is None:
        chunk_size = max(1, 2**24 // logits.shape[-1])
    flat = _SelectiveLogSoftmax.apply(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), chunk_size)
    return flat.reshape(tokens.shape)


def a2po_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, rewards: torch.Tensor, v_star: torch.Tensor,
              beta2: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean over the batch of (beta2 * (log pi - log pi_ref) - (r - V*))^2.

    `policy_logps` and `ref_logps` are per-sequence sums of completion log-probs, shape (batch,).
    Returns the loss and per-sequence statistics (detached): log_ratio, implicit_reward, advantage.
    """
    log_ratio = policy_logps - ref_logps
    implicit_reward = beta2 * log_ratio
    advantage = (rewards - v_star).to(implicit_reward.dtype)
    loss = ((implicit_reward - advantage) ** 2).mean()
    stats = {"log_ratio": log_ratio.detach(), "implicit_reward": implicit_reward.detach(), "advantage": advantage}
    return loss, stats


def group_advantages(rewards: torch.Tensor, num_generations: int,
                     scale_rewards: str = "group") -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's advantages for rewards of shape (prompts * G,), grouped by prompt (row i * G + j is sample j of i).

        A_i = r_i - mean_group(r)                              scale_rewards = "none"
        A_i = (r_i - mean_group(r)) / (std_group(r) + 1e-4)    "group"
        A_i = (r_i - mean_group(r)) / (std_batch(r) + 1e-4)    "batch" (std over all the rows given)

    std is the sample standard deviation (Bessel's correction), as in TRL. A group whose rewards are all equal gets
    A = 0 under every scaling: it carries no learning signal. Returns the advantages and the std of each row (its
    group's, or the batch's for "batch"), whose zeros TRL logs as `frac_reward_zero_std`.

    A NaN reward (a completion no reward function scored) is left out of the means and stds and gets A = 0, as in
    TRL: it would otherwise count as reward 0 in its group's baseline and earn an advantage it never had. A group
    with fewer than two scored completions has no baseline: A = 0. (An infinite reward still makes the loss
    non-finite, where the logs' `frac_nonfinite_loss` shows it.)
    """
    grouped = rewards.view(-1, num_generations)
    mean = grouped.nanmean(dim=1).repeat_interleave(num_generations)
    if scale_rewards == "batch":
        std = (nanstd(rewards) if rewards.numel() > 1 else rewards.new_zeros(())).expand_as(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    scored = (~grouped.isnan()).sum(dim=1).repeat_interleave(num_generations)
    return torch.where(rewards.isnan() | (scored < 2), 0.0, advantages), std


def decoupled_advantages(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor,
                         num_generations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO's advantages (`multi_objective_aggregation="normalize_then_sum"`, TRL 1.16): each reward function's
    rewards are normalized within their group before the weighted sum, so no function drowns the others, then the
    sum is normalized over the batch. For rewards_per_func (rows, F), rows grouped by prompt as `group_advantages`:

        z_ik = (r_ik - mean_group(r_k)) / (std_group(r_k) + 1e-4)
        s_i  = sum_k w_k z_ik                              (skipping NaN: functions that did not apply)
        A_i  = (s_i - mean_batch(s)) / (std_batch(s) + 1e-4)

    `scale_rewards` does not act here, as in TRL. A completion that no function scored gets A = 0, and is left out
    of the batch mean and std. Returns the advantages and the batch std of s per row (its zeros are TRL's
    `frac_reward_zero_std`).
    """
    num_funcs = rewards_per_func.shape[1]
    grouped = rewards_per_func.view(-1, num_generations, num_funcs)
    normalized = (grouped - grouped.nanmean(dim=1, keepdim=True)) / (nanstd(grouped, dim=1)[:, None] + 1e-4)
    summed = (normalized.view(-1, num_funcs) * reward_weights.to(normalized)).nansum(dim=1)
    summed[rewards_per_func.isnan().all(dim=1)] = math.nan
    std = (nanstd(summed) if summed.numel() > 1 else summed.new_zeros(())).expand_as(summed)
    advantages = (summed - summed.nanmean()) / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0), std


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sample standard deviation (Bessel's correction) of the values that are not NaN (over `dim`, else all);
    NaN where fewer than two are left, as TRL's `nanstd`."""
    count = (~values.isnan()).sum(dim=dim)
    mean = values.nanmean(dim=dim, keepdim=dim is not None)
    squares = ((values - mean) ** 2).nansum(dim=dim)
    return torch.where(count > 1, squares / (count - 1).clamp(min=1), squares.new_tensor(math.nan)).sqrt()


# ------------------------------------------------------------------------------------------------ GRPO's loss


@dataclass(frozen=True)
class GRPOLossSettings:
    """What `grpo_loss` reads of the config, with `GRPOConfig`'s (TRL 1.16's) names and defaults; a trainer builds
    them from its config (`from_config`). The clipping range is [1 - epsilon_low, 1 + epsilon_high] (the config's
    `epsilon`, and `epsilon_high` or else `epsilon`); `max_completion_length` is dr_grpo's normaliser."""

    loss_type: str = config_default("loss_type", "grpo")
    beta: float = config_default("beta", "grpo")
    epsilon_low: float = config_default("epsilon", "grpo")
    epsilon_high: float = config_default("epsilon", "grpo")
    delta: float | None = config_default("delta", "grpo")
    importance_sampling_level: str = config_default("importance_sampling_level", "grpo")
    use_bias_correction_kl: bool = config_default("use_bias_correction_kl", "grpo")
    off_policy_mask_threshold: float | None = config_default("off_policy_mask_threshold", "grpo")
    sapo_temperature_pos: float = config_default("sapo_temperature_pos", "grpo")
    sapo_temperature_neg: float = config_default("sapo_temperature_neg", "grpo")
    vespo_k_pos: float = config_default("vespo_k_pos", "grpo")
    vespo_lambda_pos: float = config_default("vespo_lambda_pos", "grpo")
    vespo_k_neg: float = config_default("vespo_k_neg", "grpo")
    vespo_lambda_neg: float = config_default("vespo_lambda_neg", "grpo")
    max_completion_length: int | None = None

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"Unknown loss_type {self.loss_type!r}: use one of {', '.join(LOSS_TYPES)}.")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(f"Unknown importance_sampling_level {self.importance_sampling_level!r}: use 'token' or "
                             "'sequence'.")

    @classmethod
    def from_config(cls, args: Any, max_completion_length: int | None = None) -> GRPOLossSettings:
        """The loss settings of a `GRPOConfig` (its fields of the same names), with the trainer's resolved
        `max_completion_length`."""
        epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
        given = {"epsilon_low": args.epsilon, "epsilon_high": epsilon_high,
                 "max_completion_length": max_completion_length}
        return cls(**{f.name: given[f.name] if f.name in given else getattr(args, f.name)
                      for f in dataclasses.fields(cls)})


class PolicyInputs(NamedTuple):
    """What a policy term reads of a micro-batch: (rows, T) per token, (rows, 1) per completion."""

    logps: torch.Tensor                     # log pi(y_t), with gradient
    log_ratio: torch.Tensor                 # log pi(y_t) - log pi_old(y_t), per token
    ratio: torch.Tensor                     # w, per token or per completion (`importance_sampling_level`)
    advantages: torch.Tensor                # A, (rows, 1)
    mask: torch.Tensor                      # 1 on the tokens that count
    sampling_weights: torch.Tensor | None   # vLLM's correction (`vllm_importance_weights`), or None


# The policy terms: l_t per token, and their statistics (detached; (rows, T), or (rows, 1) per completion).

def clipped_surrogate(x: PolicyInputs, s: GRPOLossSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """the clipped surrogate -min(w' A, clip(w, 1 - epsilon_low, 1 + epsilon_high) A)

    w' = min(w, delta) with `delta` (INTELLECT-2's two-sided clip), else w. Statistics: `low_clipped` (w' below
    1 - epsilon_low with A < 0) and `high_clipped` (above 1 + epsilon_high with A > 0)."""
    clipped = torch.clamp(x.ratio, 1 - s.epsilon_low, 1 + s.epsilon_high)
    ratio = x.ratio if s.delta is None else torch.clamp(x.ratio, max=s.delta)
    per_token = -torch.min(ratio * x.advantages, clipped * x.advantages)
    return per_token, {"low_clipped": ((ratio < 1 - s.epsilon_low) & (x.advantages < 0)).detach(),
                       "high_clipped": ((ratio > 1 + s.epsilon_high) & (x.advantages > 0)).detach()}


def capped_ratio_term(x: PolicyInputs, s: GRPOLossSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO's (MiniMax-M1) -sg(min(w, epsilon_high)) A log pi(y_t)

    sg: no gradient; epsilon_high is the cap itself (ScaleRL recommends 5). Statistic: `cispo_clipped` (w above the
    cap with A > 0)."""
    per_token = -torch.clamp(x.ratio, max=s.epsilon_high).detach() * x.advantages * x.logps
    return per_token, {"cispo_clipped": ((x.ratio > s.epsilon_high) & (x.advantages > 0)).detach()}


def sigmoid_gate_term(x: PolicyInputs, s: GRPOLossSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO's smooth gate instead of the clip, -sigmoid(tau (w - 1)) 4 / tau A

    tau = sapo_temperature_pos where A > 0, else sapo_temperature_neg. No statistics."""
    temperature = torch.where(x.advantages > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
    return -torch.sigmoid(temperature * (x.ratio - 1)) * 4 / temperature * x.advantages, {}


def gamma_weight_term(x: PolicyInputs, s: GRPOLossSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VESPO's -sg(phi(W)) A log pi(y_t), phi a Gamma-shaped weight of the completion's ratio W

    (`vespo_gamma_weights`, which takes vLLM's per-token weights into W). Statistic: `phi`, per completion."""
    phi = vespo_gamma_weights(x.advantages, x.log_ratio, x.mask, x.sampling_weights, k_pos=s.vespo_k_pos,
                              lambda_pos=s.vespo_lambda_pos, k_neg=s.vespo_k_neg, lambda_neg=s.vespo_lambda_neg)
    return -phi * x.advantages * x.logps, {"phi": phi}


@torch.no_grad()
def vespo_gamma_weights(advantages: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor,
                        sampling_weights: torch.Tensor | None, *, k_pos: float, lambda_pos: float, k_neg: float,
                        lambda_neg: float) -> torch.Tensor:
    """VESPO's weight per completion (TRL 1.16's `get_gamma_weights`), a coefficient without gradient:

        log W  = clamp( sum_t m_t clamp(log pi(y_t) - log pi_old(y_t), -20, 20)
                        + sum_t clamp(log rho_t, log 1e-8, 20),  log 1e-8, 20)     (rho: vLLM's token weights)
        phi(W) = exp(lambda + k log W - lambda W)                                   (phi(1) = 1)

    with (k, lambda) = (k_pos, lambda_pos) where A >= 0, else (k_neg, lambda_neg): a Gamma-shaped weight that
    fades completions whose ratio strays from 1 either way (the power k below 1, the decay lambda above).
    `advantages` (rows, 1); returns (rows, 1).
    """
    floor = math.log(1e-8)
    log_weight = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    if sampling_weights is not None:
        log_weight = log_weight + torch.clamp(torch.log(sampling_weights), floor, 20.0).sum(-1, keepdim=True)
    log_weight = torch.clamp(log_weight, floor, 20.0)
    positive = advantages >= 0
    k = torch.where(positive, k_pos, k_neg)
    lam = torch.where(positive, lambda_pos, lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_weight - lam * torch.exp(log_weight))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


# The aggregations of the masked terms m l over a micro-batch.

def completion_mean(terms: torch.Tensor, mask: torch.Tensor, s: GRPOLossSettings, num_items: Any) -> torch.Tensor:
    """mean_i ( sum_t m l / max(sum_t m, 1) ): each completion weighs the same"""
    return ((terms * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def micro_batch_token_mean(terms: torch.Tensor, mask: torch.Tensor, s: GRPOLossSettings,
                           num_items: Any) -> torch.Tensor:
    """sum m l / max(sum m, 1): each token of the micro-batch weighs the same"""
    return (terms * mask).sum() / mask.sum().clamp(min=1.0)


def fixed_length_mean(terms: torch.Tensor, mask: torch.Tensor, s: GRPOLossSettings, num_items: Any) -> torch.Tensor:
    """sum m l / (rows * max_completion_length): Dr. GRPO's constant normaliser"""
    return (terms * mask).sum() / (terms.shape[0] * s.max_completion_length)


def step_token_mean(terms: torch.Tensor, mask: torch.Tensor, s: GRPOLossSettings, num_items: Any) -> torch.Tensor:
    """sum m l / num_items: each token of the optimizer step weighs the same (DAPO)

    `num_items`: TRL's is the mask tokens of the optimizer step's whole batch (all micro-batches, all processes)
    over the number of processes, so the micro-batch losses add up to the step's token mean; the trainer passes
    that over the number of micro-batches, since it divides every micro-batch's loss by their number."""
    return (terms * mask).sum() / num_items


def completion_sum_mean(terms: torch.Tensor, mask: torch.Tensor, s: GRPOLossSettings,
                        num_items: Any) -> torch.Tensor:
    """mean_i ( sum_t m l ): each completion weighs its length (with "sequence": GSPO's loss times the length)"""
    return (terms * mask).sum(-1).mean()


# The metrics TRL logs of a policy term's statistics, over the counted tokens (`mask`, float).

def statistic_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """A statistic's mean: over the completions where it is one per completion, (rows, 1), else over the counted
    tokens, as TRL's."""
    values = values.float()
    if values.shape[1] == 1:
        return values.mean().item()
    return ((values * mask).sum() / mask.sum().clamp(min=1.0)).item()


def _per_completion(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A statistic's mean per completion, leaving out the empty ones (they have no share)."""
    values = values.float()
    if values.shape[1] == 1:
        return values[:, 0]
    lengths = mask.sum(-1)
    return (values * mask).sum(-1)[lengths > 0] / lengths[lengths > 0]


def clip_ratios(stats: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    low, high = stats["low_clipped"], stats["high_clipped"]
    out = {"clip_ratio/low_mean": statistic_mean(low, mask), "clip_ratio/high_mean": statistic_mean(high, mask),
           "clip_ratio/region_mean": statistic_mean(low | high, mask)}
    low_share, high_share = _per_completion(low, mask), _per_completion(high, mask)
    if len(low_share):
        out.update({"clip_ratio/low_min": low_share.min().item(), "clip_ratio/high_max": high_share.max().item()})
    return out


def cispo_clip_ratio(stats: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    return {"cispo_clip_ratio": statistic_mean(stats["cispo_clipped"], mask)}


def phi_mean(stats: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    return {"vespo/phi_seq_mean": statistic_mean(stats["phi"], mask)}


def no_statistics(stats: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    return {}


class LossType(NamedTuple):
    """One GRPO loss type: its policy term (l_t and its statistics), the aggregation of the masked terms over a
    micro-batch, and the metrics TRL logs of the statistics. `level`: the `importance_sampling_level` its paper's
    setup uses, where TRL warns of another (`level_warning`, given the loss type's name); `takes_sampling_weights`:
    the term takes vLLM's per-token weights itself, instead of l_t being multiplied by them."""

    term: Callable[[PolicyInputs, GRPOLossSettings], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    aggregate: Callable[[torch.Tensor, torch.Tensor, GRPOLossSettings, Any], torch.Tensor]
    statistics: Callable[[dict[str, torch.Tensor], torch.Tensor], dict[str, float]]
    level: str | None = None
    level_warning: str = ""
    takes_sampling_weights: bool = False

    def describe(self) -> str:
        """One line for the docs: the first lines of its term's and its aggregation's docstrings."""
        return f"{self.term.__doc__.splitlines()[0]}; {self.aggregate.__doc__.splitlines()[0]}"


SUMS_TOKENS = ("With importance_sampling_level='sequence', loss_type {!r} sums per-token terms, which weights each "
               "completion by its length; GSPO's setup is loss_type='grpo'.")
# GRPO's loss types, TRL 1.16's: `a2po.settings.GRPO_LOSS_TYPES` names them without torch (a test holds the two
# equal). A new loss type is an entry here, with its term or aggregation where it has a new one.
LOSS_TYPES: dict[str, LossType] = {
    "grpo": LossType(clipped_surrogate, completion_mean, clip_ratios),
    "dr_grpo": LossType(clipped_surrogate, fixed_length_mean, clip_ratios, "token", SUMS_TOKENS),
    "dapo": LossType(clipped_surrogate, step_token_mean, clip_ratios, "token", SUMS_TOKENS),
    "bnpo": LossType(clipped_surrogate, micro_batch_token_mean, clip_ratios, "token", SUMS_TOKENS),
    "cispo": LossType(capped_ratio_term, step_token_mean, cispo_clip_ratio, "token", SUMS_TOKENS),
    "sapo": LossType(sigmoid_gate_term, completion_mean, no_statistics),
    "luspo": LossType(clipped_surrogate, completion_sum_mean, clip_ratios, "sequence",
                      "loss_type {!r} is GSPO's loss weighted by length: set importance_sampling_level='sequence' to "
                      "mirror the paper's setup."),
    "vespo": LossType(gamma_weight_term, step_token_mean, phi_mean, "token",
                      "loss_type {!r} computes its own sequence-level weights: importance_sampling_level should be "
                      "'token' (the default).", takes_sampling_weights=True),
}


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, ref_logps: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, settings: GRPOLossSettings, *,
              num_items: torch.Tensor | float | None = None, sampling_weights: torch.Tensor | None = None,
              sampling_logps: torch.Tensor | None = None,
              token_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO's loss on one micro-batch, as TRL 1.16's `GRPOTrainer._compute_loss` computes it.

    `logps`, `old_logps`, `ref_logps`: (rows, T) per-token log-probs of the completions under the policy, the
    policy that sampled them (None: the same, detached: `num_iterations` = 1) and the reference; `advantages`
    (rows,); `mask` (rows, T), 1 on the completion tokens that count. The importance weight is, per token or per
    completion (`importance_sampling_level`, "sequence" is GSPO's):

        token:     w_t = exp(log pi(y_t) - log pi_old(y_t))
        sequence:  w   = exp(sum_t m_t (log pi(y_t) - log pi_old(y_t)) / max(sum_t m_t, 1))

    With one iteration per generation pi_old is pi detached, so w = 1: GSPO, the clipping, CISPO's cap and SAPO's
    gate then change only the gradient's scale, not which tokens move (they act off-policy, num_iterations > 1 or
    vLLM's sampling). The policy term l_t is the loss type's (`LOSS_TYPES`), then, in TRL's order: l_t *= the
    off-policy sequence mask (`off_policy_mask_threshold`, DeepSeek-V3.2: a completion with A < 0 whose mean
    log pi_sampling - log pi over its tokens exceeds the threshold leaves the loss; pi_sampling is `sampling_logps`,
    vLLM's, else pi_old), l_t *= `token_mask` (the high-entropy tokens, `high_entropy_mask`), l_t *=
    `sampling_weights` (vLLM's correction, `vllm_importance_weights`, (rows, T) per token or (rows, 1) per
    sequence; a term that takes them itself aside), and with beta > 0

        kl_t = exp(log pi_ref(y_t) - log pi(y_t)) - (log pi_ref(y_t) - log pi(y_t)) - 1      (>= 0)
        l_t += beta * kl_t * w     (or beta * kl_t without `use_bias_correction_kl`)

    and the loss type aggregates m l over the micro-batch (`num_items`: the step-token normaliser's).

    Returns the loss and detached statistics: `kl` (beta > 0) and the policy term's.
    """
    loss_type = LOSS_TYPES[settings.loss_type]
    old_logps = logps.detach() if old_logps is None else old_logps
    advantages = advantages[:, None]
    mask = mask.to(logps.dtype)
    log_ratio = logps - old_logps
    if settings.importance_sampling_level == "sequence":
        ratio = torch.exp(((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None])
    else:
        ratio = torch.exp(log_ratio)
    stats: dict[str, torch.Tensor] = {}
    if settings.beta != 0.0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if settings.use_bias_correction_kl:
            kl = kl * ratio
        stats["kl"] = kl.detach()

    per_token, term_stats = loss_type.term(PolicyInputs(logps, log_ratio, ratio, advantages, mask, sampling_weights),
                                           settings)
    stats.update(term_stats)
    if settings.off_policy_mask_threshold is not None:
        sampled_by = old_logps if sampling_logps is None else sampling_logps
        divergence = torch.nan_to_num(sampled_by - logps.detach(), nan=0.0)  # a token vLLM did not score: no evidence
        mean_divergence = (divergence * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        kept = (advantages >= 0) | (mean_divergence <= settings.off_policy_mask_threshold)
        per_token = per_token * kept.to(mask.dtype)
    if token_mask is not None:
        per_token = per_token * token_mask
    if sampling_weights is not None and not loss_type.takes_sampling_weights:
        per_token = per_token * sampling_weights
    if settings.beta != 0.0:
        per_token = per_token + settings.beta * kl
    return loss_type.aggregate(per_token, mask, settings, num_items), stats


def describe_loss_types() -> str:
    """The loss types, a line each (`LossType.describe`): what the config's docs list."""
    return "\n".join(f'"{name}": {entry.describe()}' for name, entry in LOSS_TYPES.items())


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float,
                      population: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens among the top `top_entropy_quantile` by entropy ("Beyond the 80/20 rule", TRL 1.16's
    `get_high_entropy_mask`): True where mask is 1 and H_t >= the (1 - quantile) quantile of the entropies of
    `population` (default: the masked tokens of `entropies`; the trainer passes every process's). 0.0 keeps only the
    highest-entropy tokens, 1.0 keeps them all."""
    population = entropies[mask.bool()].float() if population is None else population
    if population.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    threshold = torch.quantile(population, 1 - top_entropy_quantile)
    return ((entropies * mask) >= threshold) & mask.bool()


def token_entropies(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy -sum_v p_v log p_v of softmax(logits) per position, (batch, T) from (batch, T, vocab), a chunk of
    positions at a time (2**24 logits each by default, as `token_logprobs`), in float32."""
    flat = logits.reshape(-1, logits.shape[-1])
    chunk_size = max(1, 2**24 // logits.shape[-1]) if chunk_size is None else chunk_size
    parts = []
    for start in range(0, flat.shape[0], chunk_size):
        logp = torch.log_softmax(flat[start:start + chunk_size].float(), dim=-1)
        parts.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(parts).reshape(logits.shape[:-1])


def vllm_importance_weights(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                            clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL 1.16's importance-sampling correction for completions sampled by vLLM (`use_vllm`): weights that turn
    the loss's expectation under vLLM's sampling distribution into one under the policy's.

    `old_logps`: (rows, T) per-token log-probs of the completions under the policy that sampled them, by the
    trainer's forward pass; `sampling_logps`: the same tokens' log-probs as vLLM sampled them (NaN where vLLM gave
    none: no correction there); `mask` (rows, T): the tokens that count. The ratio is

        rho_t = exp(log pi_old(y_t) - log pi_vllm(y_t))             "token_*" modes, (rows, T)
        rho   = exp(sum_t m_t (log pi_old(y_t) - log pi_vllm(y_t)))  "sequence_*" modes, (rows, 1)

    then "*_truncate" clamps it to [clip_min, clip_max] (a None bound is open) and "*_mask" sets it to 0 outside
    that range (the token, or the whole sequence, leaves the loss). The weights are data: no gradient flows.
    """
    if mode not in VLLM_IS_MODES:
        raise ValueError(f"Unknown vllm_importance_sampling_mode {mode!r}: use one of {', '.join(VLLM_IS_MODES)}.")
    difference = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(dim=-1, keepdim=True)
    ratio = torch.exp(difference)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def pass_at_k(num_correct: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Unbiased pass@k per prompt from c correct out of n samples: 1 - C(n-c, k) / C(n, k)."""
    c = torch.as_tensor(num_correct, dtype=torch.float64)
    if k > n:
        raise ValueError(f"pass@k needs k <= n (got k={k}, n={n})")
    # prod_{i=n-c+1}^{n} (1 - k/i) is C(n-c, k) / C(n, k), numerically stable.
    out = torch.empty_like(c)
    for j, cj in enumerate(c.tolist()):
        cj = int(cj)
        out[j] = 1.0 if n - cj < k else 1.0 - math.prod(1 - k / i for i in range(n - cj + 1, n + 1))
    return out
