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

with ratio_t = pi(y_t) / pi_old(y_t); the aggregation over tokens is `loss_type`'s (`grpo_loss`). Where A*-PO
samples once per prompt per step and regresses onto a target fixed before training, GRPO samples G times per prompt
per step and compares the G samples with each other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


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


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sample standard deviation (Bessel's correction) of the values that are not NaN (over `dim`, else all);
    NaN where fewer than two are left, as TRL's `nanstd`."""
    count = (~values.isnan()).sum(dim=dim)
    mean = values.nanmean(dim=dim, keepdim=dim is not None)
    squares = ((values - mean) ** 2).nansum(dim=dim)
    return torch.where(count > 1, squares / (count - 1).clamp(min=1), squares.new_tensor(math.nan)).sqrt()


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, ref_logps: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, *, loss_type: str = "dapo", beta: float = 0.0,
              epsilon_low: float = 0.2, epsilon_high: float = 0.2, max_completion_length: int | None = None,
              num_items: torch.Tensor | float | None = None, bias_correction_kl: bool = True,
              sampling_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO's loss on one micro-batch, as TRL 1.16's `GRPOTrainer` computes it (token-level ratios).

    `logps`, `old_logps`, `ref_logps`: (rows, T) per-token log-probs of the completions under the policy, the
    policy that sampled them (None: the same, detached: `num_iterations` = 1) and the reference; `advantages`
    (rows,); `mask` (rows, T), 1 on the completion tokens that count. Per token t of row i:

        ratio_t = exp(log pi(y_t) - log pi_old(y_t))
        l_t = -min(ratio_t * A_i, clip(ratio_t, 1 - epsilon_low, 1 + epsilon_high) * A_i)
        kl_t = exp(log pi_ref(y_t) - log pi(y_t)) - (log pi_ref(y_t) - log pi(y_t)) - 1      (>= 0)
        l_t *= w_t                       (`sampling_weights`, vLLM's correction, before the KL term as in TRL)
        l_t += beta * kl_t * ratio_t     (or beta * kl_t without `bias_correction_kl`)

    and over the micro-batch, with m the mask:

        grpo:     mean_i ( sum_t m l / max(sum_t m, 1) )          each completion weighs the same
        bnpo:     sum m l / max(sum m, 1)                         each token of the micro-batch weighs the same
        dr_grpo:  sum m l / (rows * max_completion_length)
        dapo:     sum m l / num_items                             each token of the optimizer step weighs the same

    `num_items` (dapo): TRL's is the mask tokens of the optimizer step's whole batch (all micro-batches, all
    processes) divided by the number of processes, so the micro-batch losses add up to the step's token mean; the
    trainer passes that over the number of micro-batches, since it divides every micro-batch's loss by their number,
    as it does the other three, micro-batch means. `sampling_weights` (None: 1) are `vllm_importance_weights`,
    (rows, T) per token or (rows, 1) per sequence.

    Returns the loss and detached statistics: per-token `kl` (beta > 0), and the masks `low_clipped` (ratio below
    1 - epsilon_low with A < 0) and `high_clipped` (above 1 + epsilon_high with A > 0), whose means TRL logs.
    """
    old_logps = logps.detach() if old_logps is None else old_logps
    advantages = advantages[:, None]
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if sampling_weights is not None:
        per_token = per_token * sampling_weights
    stats: dict[str, torch.Tensor] = {}
    if beta != 0.0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + beta * kl
        stats["kl"] = kl.detach()
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.shape[0] * max_completion_length)
    elif loss_type == "dapo":
        loss = (per_token * mask).sum() / num_items
    else:
        raise ValueError(f"Unknown loss_type {loss_type!r}: use grpo, dr_grpo, dapo or bnpo.")
    stats["low_clipped"] = ((ratio < 1 - epsilon_low) & (advantages < 0)).detach()
    stats["high_clipped"] = ((ratio > 1 + epsilon_high) & (advantages > 0)).detach()
    return loss, stats


VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


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
