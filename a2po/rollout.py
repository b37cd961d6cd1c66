"""The rollout engine used by both stages: KV-cached sampling with a shared prompt prefill.

Why not `model.generate`: under gradient checkpointing in train mode `generate` silently drops the KV cache and
re-runs the whole sequence every step; `num_return_sequences` prefills the same prompt N times; and finished rows
keep being computed until the longest one ends. Here the prompt batch is prefilled once, its cache is repeated
N times, finished rows are dropped from the batch as they end, and the loop stops when every row has ended.
The forward passes come from `a2po.decoding`: a lean KV-cached forward for Llama-family models, the model's own
forward with a `DynamicCache` for the rest.
Sampling uses the same processing as `generate` (temperature, then top-k, then top-p) and greedy decoding gives the
same tokens as `generate(do_sample=False)` (tested).

Reproducible sampling: given `row_keys`, each sequence draws its tokens from a random stream of its own, seeded by
its key alone (for stage 1: run seed, prompt id, sample index). A sequence's tokens then do not depend on which
other sequences share its batch, on the batch size, on the process that decodes it, or on what ran before: a
resumed, chunked or sharded stage 1 samples exactly what an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from a2po.core import token_entropies, token_logprobs
from a2po.decoding import LlamaDecoder, accepts, base_model, decoder_for, positions_from_mask

# Logits a chunk of the lean head holds at once (`per_token_logprobs`): 128 MiB in float32, 220 positions at a 152k
# vocabulary.
HEAD_CHUNK_ELEMENTS = 2**25


@contextmanager
def eval_mode(model: torch.nn.Module):
    """Eval mode for decoding (gradient checkpointing disables the KV cache in train mode), restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering; filtered entries become -inf."""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop tokens once the mass before them already reaches top_p; the most likely token always stays.
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def stream_seed(key: Hashable) -> int:
    """A 63-bit seed from a key such as `(seed, "values", prompt_id, j)`: the same on every machine and run."""
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little") >> 1


def row_uniforms(keys: Sequence[Hashable], steps: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(len(keys), steps) uniforms in [0, 1): row i is the start of the random stream seeded by `keys[i]`.

    Drawn on the CPU (one small generator per row, ~5 us each) and moved once, so the numbers are the same on any
    device; a decode step then reads column t instead of asking a generator for fresh numbers.
    """
    out = torch.empty(len(keys), steps, dtype=torch.float64)
    generator = torch.Generator()
    for i, key in enumerate(keys):
        generator.manual_seed(stream_seed(key))
        out[i] = torch.rand(steps, generator=generator, dtype=torch.float64)
    return out.to(device)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None,
                  uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from the categorical distribution `probs` (rows need not be normalised).

    Inverse-CDF sampling: one uniform number per row, searched in the cumulative sum. It draws from exactly the
    same distribution as `torch.multinomial(probs, 1)` but needs one random number per row instead of one per
    vocabulary entry, which is much faster on a CPU (figures: docs/benchmarks.md, "Design figures"). Zero-probability
    tokens (filtered by top-k/top-p) have empty intervals and are never drawn. `uniforms` (one per row) replaces
    the generator's numbers, for reproducible per-row streams (`row_uniforms`).
    """
    cdf = probs.float().cumsum(-1)
    if uniforms is None:
        uniforms = torch.rand(probs.shape[0], generator=generator, device=probs.device)
    u = uniforms.to(cdf.dtype).view(-1, 1) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1).squeeze(-1)


@torch.no_grad()
def sample_completions(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                       max_new_tokens: int, eos_token_ids: Sequence[int], pad_token_id: int,
                       num_samples: int = 1, do_sample: bool = True, temperature: float = 1.0,
                       top_k: int | None = None, top_p: float = 1.0,
                       generator: torch.Generator | None = None,
                       row_keys: Sequence[Hashable] | None = None, greedy_samples: int = 0) -> torch.Tensor:
    """Sample `num_samples` completions per left-padded prompt.

    Returns completion ids of shape (batch * num_samples, T) with T <= max_new_tokens; rows are grouped by prompt
    (row i * num_samples + j is sample j of prompt i); after a row's first EOS the row holds `pad_token_id`.
    `row_keys` (one per output row) gives each row its own random stream (see the module docstring); without
    them, rows draw from `generator` (or torch's global generator). The first `greedy_samples` samples of each
    prompt take the most likely token instead: greedy answers decoded with the samples in one decode, the prompt
    prefilled once for both (evaluation's greedy accuracy next to its sampled loss, the playground's pair).
    """
    batch = input_ids.shape[0]
    device = input_ids.device
    eos = torch.tensor(list(eos_token_ids), device=device)
    total = batch * num_samples
    uniforms = None
    if do_sample and row_keys is not None:
        if len(row_keys) != total:
            raise ValueError(f"row_keys has {len(row_keys)} keys for {total} sequences ({batch} prompts x "
                             f"{num_samples} samples); give one key per sequence.")
        uniforms = row_uniforms(row_keys, max_new_tokens, device)
    with eval_mode(model):
        decoder = decoder_for(model, capacity=input_ids.shape[1] + max_new_tokens)
        logits = decoder.prefill(input_ids, attention_mask, num_samples)
        completions = torch.full((total, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        active = torch.arange(total, device=device)  # original row of each row still in the batch
        length = 0
        for step in range(max_new_tokens):
            if do_sample:
                tokens = sample_tokens(process_logits(logits, temperature, top_k, top_p).softmax(-1), generator,
                                       None if uniforms is None else uniforms[active, step])
                if greedy_samples:  # a `where`, not a boolean index: that would read the mask on the host
                    tokens = torch.where(active % num_samples < greedy_samples, logits.argmax(-1), tokens)
            else:
                tokens = logits.argmax(-1)
            completions[active, step] = tokens
            length = step + 1
            if step == max_new_tokens - 1:
                break
            # The step's one read on the host (a GPU waits for it): the rows still decoding, whose count says both
            # whether any is left and whether some finished.
            keep = (~torch.isin(tokens, eos)).nonzero().squeeze(-1)
            if len(keep) == 0:
                break
            if len(keep) < len(tokens):
                # Drop finished rows so the rest of the decode only pays for live sequences.
                decoder.select(keep)
                active, tokens = active[keep], tokens[keep]
            logits = decoder.step(tokens)
    return completions[:, :length]


def per_token_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                       temperature: float = 1.0, with_entropy: bool = False, lean_head: bool = False,
                       autocast_dtype: torch.dtype | None = None):
    """log pi(y_t | x, y_<t) of each completion token, 0 where `completion_mask` is 0; shape (batch, T). With
    `with_entropy`, also the entropy of pi(. | x, y_<t) at each position (same shape, no gradient), as a pair.

    With `temperature`, pi is the tempered policy softmax(logits / temperature) that sampled the tokens (GRPO's
    ratios, as in TRL). Only the completion positions' logits are computed (`logits_to_keep`), and the log-softmax
    is gathered in chunks (`core.token_logprobs`), so the full-vocabulary float32 log-softmax never exists for the
    whole sequence.

    `lean_head` (a single process's plain Llama-family model, `lean_head_supported`): no full-vocabulary tensor at
    all. The model's body gives the hidden states, and the output layer turns a chunk of positions at a time into
    logits (`HEAD_CHUNK_ELEMENTS`), recomputed in the backward pass rather than kept: the model's forward would hold
    the completion's bf16 logits, their float32 copy (accelerate's autocast wrapper) and, backward, their float32
    gradient, several GiB at a 152k vocabulary. The body runs under `autocast_dtype`'s autocast, as the trainer's
    wrapper would run the whole model; the same operations on the same values, chunk by chunk.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    num_completion = completion_ids.shape[1]
    if lean_head and lean_head_supported(model):
        logps, entropies = _lean_head_logprobs(model, input_ids, attention_mask, completion_ids, temperature,
                                               with_entropy, autocast_dtype)
        logps = logps * completion_mask
        return (logps, entropies * completion_mask) if with_entropy else logps
    kwargs = {"logits_to_keep": num_completion + 1} if accepts(model, "logits_to_keep") else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=positions_from_mask(attention_mask), use_cache=False, **kwargs).logits
    logits = logits[:, -num_completion - 1:-1]
    if temperature != 1.0:
        logits = logits / temperature
    logps = token_logprobs(logits, completion_ids) * completion_mask
    if not with_entropy:
        return logps
    with torch.no_grad():
        return logps, token_entropies(logits) * completion_mask


def lean_head_supported(model: torch.nn.Module) -> bool:
    """Whether `per_token_logprobs(lean_head=True)` may call `model`'s body and output layer apart: a plain
    Llama-family model (their logits are the output layer's product, unscaled; `LlamaDecoder.supports`), maybe under
    PEFT, not wrapped by `torch.compile` (whose compiled forward it would skip) or for several processes (whose
    wrapper's forward synchronises the gradients)."""
    if hasattr(model, "_orig_mod") or isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return False
    return LlamaDecoder.supports(model)


def _lean_head_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        completion_ids: torch.Tensor, temperature: float, with_entropy: bool,
                        autocast_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    base = base_model(model)
    head = base.get_output_embeddings()
    autocast = (torch.autocast(input_ids.device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else nullcontext())
    num_completion = completion_ids.shape[1]
    with autocast:
        hidden = base.model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=positions_from_mask(attention_mask), use_cache=False).last_hidden_state
    hidden = hidden[:, -num_completion - 1:-1]
    flat_hidden, flat_tokens = hidden.reshape(-1, hidden.shape[-1]), completion_ids.reshape(-1)
    vocab = head.weight.shape[0] if hasattr(head, "weight") else base.config.vocab_size

    def chunk_logprobs(h: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast:
            logits = head(h)
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        with torch.no_grad():
            entropy = token_entropies(logits) if with_entropy else torch.zeros_like(tokens, dtype=torch.float32)
        return token_logprobs(logits, tokens), entropy

    size = max(1, HEAD_CHUNK_ELEMENTS // vocab)
    logps, entropies = [], []
    for start in range(0, flat_tokens.shape[0], size):
        h, tokens = flat_hidden[start:start + size], flat_tokens[start:start + size]
        if torch.is_grad_enabled() and h.requires_grad:  # recompute the chunk's logits in the backward pass
            part, entropy = checkpoint(chunk_logprobs, h, tokens, use_reentrant=False)
        else:
            part, entropy = chunk_logprobs(h, tokens)
        logps.append(part)
        entropies.append(entropy)
    shape = completion_ids.shape
    return torch.cat(logps).reshape(shape), (torch.cat(entropies).reshape(shape) if with_entropy else None)


def sequence_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Sum over completion tokens (where `completion_mask` is 1) of log pi(y_t | x, y_<t); shape (batch,)."""
    return per_token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask).sum(-1)


# ------------------------------------------------------------------------------------------------ a rollout, scored

@dataclass
class Rollout:
    """Completions sampled for a batch of prompts, decoded and scored: row i * num_samples + j of the completion
    tensors is sample j of prompt i."""

    rows: list[dict[str, Any]]         # the dataset rows, one per prompt
    prompt_ids: torch.Tensor           # (prompts, P), left-padded
    prompt_mask: torch.Tensor
    prompt_texts: list[str]            # what the model saw (chat template applied)
    completion_ids: torch.Tensor       # (prompts * num_samples, T)
    completion_mask: torch.Tensor      # 1 up to and including each row's first EOS
    completions: list[str]
    rewards: torch.Tensor              # (prompts * num_samples,) float64: the weighted sum of the reward functions
    rewards_per_func: torch.Tensor     # (prompts * num_samples, F)
    clipped: torch.Tensor              # rows that never ended within max_completion_length
    num_samples: int = 1
    # (prompts * num_samples, T): each token's log-prob as the sampler drew it, where asked (vLLM only), else None
    sampling_logps: torch.Tensor | None = None
    # The reward functions' `log_extra` columns: one value per completion, in the order of `completions`.
    extra_columns: dict[str, list] = field(default_factory=dict)

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1).float()

    def extra(self, k: int) -> dict[str, Any]:
        """Completion `k`'s `log_extra` values, by column (the `"extra"` of a sample)."""
        return {column: values[k] for column, values in self.extra_columns.items()}


class Scores(NamedTuple):
    """The reward functions' verdict on a batch of completions (`BaseTrainer._score`)."""

    total: torch.Tensor                 # (completions,) float64: the weighted sum, NaN where no function applied
    per_func: torch.Tensor              # (completions, F), NaN where a function returned None
    extra_columns: dict[str, list]      # `log_extra`: one value per completion


def completion_token_lists(completion_ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each completion's token ids up to and including its first end token, without padding: the `completion_ids`
    TRL passes to reward functions."""
    return [ids[keep.bool()].tolist() for ids, keep in zip(completion_ids.cpu(), mask.cpu())]
