r"""The A*-PO math, in one place.

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
    So neither pass holds a float32 copy of all the logits: on bf16 logits of 8 x 256 positions x 151,936
    vocabulary, autograd-through-chunks kept ~3.5 GB alive for the backward pass, this ~1.8 GB.
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
    (64 MiB in float32: 110 positions at a 152k vocabulary), which kept a bf16 log-prob pass at 8 x 256 positions
    of that vocabulary at 1.6 GB with gradients instead of 2.7 GB with 1024-position chunks.
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
