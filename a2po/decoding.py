"""Incremental (KV-cached) forward passes for the rollout loop, behind one small interface.

`decoder_for(model, ...)` returns a `LlamaDecoder` for Llama-family models (Llama, SmolLM, Qwen2/2.5) and a
`TransformersDecoder` (the model's own forward with a `DynamicCache`) for everything else; `A2PO_DECODER=transformers`
forces the latter. Both give the next-token logits of the same model; tests check they pick the same tokens.

Why a second forward for Llama-family models: where a decode step is latency-bound (small batches, small models,
GPUs) the general forward spends much of each step outside the matrix products, and stage 1 stores each prompt's
keys and values N times. Transformers' `DynamicCache` concatenates every layer's keys and values into a fresh
tensor each step; its SDPA call for a single query token costs more than the two small matmuls below; and the mask
and module plumbing add a fixed cost to every step (figures: docs/benchmarks.md, "Design figures"). `LlamaDecoder`
writes keys and values into buffers sized for the whole rollout, keeps one copy of a prompt's keys and values for
all its samples, skips masks when no row is padded, and calls the model's own projection, MLP and norm modules, so
PEFT adapters (and their `disable_adapter()`), quantised linears and autocast behave exactly as in the model's
forward. Where a step is compute-bound (SmolLM2-135M at 128 rows on a 2-core CPU) both forwards run at the same
speed.
"""

from __future__ import annotations

import inspect
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from transformers import DynamicCache

LLAMA_FAMILY = {"LlamaForCausalLM": "LlamaDecoderLayer", "Qwen2ForCausalLM": "Qwen2DecoderLayer"}


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a `torch.compile` wrapper (`torch_compile=True`) and a PEFT wrapper: both hide the
    model's signature and modules."""
    model = getattr(model, "_orig_mod", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def accepts(model: torch.nn.Module, name: str) -> bool:
    """Whether the model's forward takes the keyword `name`."""
    try:
        return name in inspect.signature(base_model(model).forward).parameters
    except (TypeError, ValueError):
        return False


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class TransformersDecoder:
    """The model's own forward with a `DynamicCache`: works for every causal LM transformers supports."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.kwargs = {"logits_to_keep": 1} if accepts(model, "logits_to_keep") else {}
        # transformers 5.24 renamed `past_key_values` to `cache`; older 5.x releases only know the old name.
        self.cache_kwarg = "cache" if accepts(model, "cache") else "past_key_values"

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: int) -> torch.Tensor:
        self.cache = DynamicCache(config=base_model(self.model).config)
        self.attention_mask = attention_mask
        positions = positions_from_mask(attention_mask)
        self.next_position = positions[:, -1] + 1
        logits = self._forward(input_ids, positions)
        if repeats > 1:
            self.cache.batch_repeat_interleave(repeats)
            logits = logits.repeat_interleave(repeats, dim=0)
            self.attention_mask = attention_mask.repeat_interleave(repeats, dim=0)
            self.next_position = self.next_position.repeat_interleave(repeats, dim=0)
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(len(tokens), 1)], dim=1)
        logits = self._forward(tokens[:, None], self.next_position[:, None])
        self.next_position = self.next_position + 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention_mask, self.next_position = self.attention_mask[rows], self.next_position[rows]

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=self.attention_mask, position_ids=position_ids,
                         use_cache=True, **{self.cache_kwarg: self.cache}, **self.kwargs)
        return out.logits[:, -1]


# Up to this many rows, a CPU linear layer is computed as (W @ x^T)^T (see `project`).
FEW_ROWS = 32


def project(linear: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`linear(x)`; for a plain `nn.Linear` on the CPU with at most `FEW_ROWS` rows, computed as (W @ x^T)^T.

    Same product, another operand order: MKL's kernels for x @ W^T with a handful of rows read the weights slowly on
    a small CPU, while W @ x^T streams W's rows like a wide product, so few-row decode steps get faster up to
    `FEW_ROWS` rows, with no gain at one row (figures: docs/benchmarks.md, "Design figures"). Results differ from
    `linear(x)` only in float rounding (summation order). Adapter-wrapped (LoRA), quantised and GPU layers are called
    as they are.
    """
    rows = x.numel() // x.shape[-1]
    if type(linear) is not torch.nn.Linear or rows > FEW_ROWS or x.device.type != "cpu":
        return linear(x)
    flat = x.reshape(rows, x.shape[-1]).t()
    out = (torch.mm(linear.weight, flat) if linear.bias is None
           else torch.addmm(linear.bias[:, None], linear.weight, flat))
    return out.t().reshape(*x.shape[:-1], out.shape[0])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, the half-split convention of Llama and Qwen2: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaDecoder:
    """KV-cached forward of a Llama-family decoder; a prompt's keys and values are stored once for its N samples.

    Per layer: h += o(attn(rope(q(norm(h))), rope(k(norm(h))), v(norm(h)))); h += down(act(gate(x)) * up(x)) with
    x = norm(h); logits = lm_head(norm(h_last)). Linear layers go through `project`.

    The cache has two parts per layer: the prompts' keys and values, (prompts, kv_heads, prompt_len, d), written
    once by the prefill, and the generated tokens', (rows, kv_heads, new_tokens, d), in a buffer sized for the
    whole rollout. Row r is sample r % N of prompt r // N (its "slot"; rows that finished are dropped, and `slots`
    remembers where the rest came from). A new token's query attends to both parts under one softmax: against
    the prompt part the N samples' queries of a prompt are stacked into one (N * groups, d) matrix per key/value
    head, so the prompt is read once for all of them; against the generated part each row has its own keys.
    Keys are stored in fp32 whatever the compute dtype (values in the compute dtype): a step's scores are fp32
    products, as in the fused attention kernels of the training forward, without upcasting the keys every step.
    """

    def __init__(self, model: torch.nn.Module, capacity: int):
        self.base = base_model(model)
        self.layers = list(self.base.model.layers)
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.groups = attention.num_key_value_groups
        self.scaling = attention.scaling
        self.num_kv_heads = self.base.config.num_key_value_heads
        self.capacity = capacity

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Plain (unsharded, unhooked) Llama/Qwen2 causal LMs with full attention in every layer."""
        base = base_model(model)
        layer_class = LLAMA_FAMILY.get(type(base).__name__)
        if layer_class is None or not hasattr(base, "model") or not hasattr(base.model, "rotary_emb"):
            return False
        config = base.config
        if getattr(config, "use_sliding_window", False) or any(
                kind != "full_attention" for kind in (getattr(config, "layer_types", None) or [])):
            return False
        for layer in base.model.layers:
            if type(layer).__name__ != layer_class or getattr(layer.self_attn, "sliding_window", None):
                return False
            if type(layer.mlp).__name__ != layer_class.replace("DecoderLayer", "MLP"):
                return False
        # Device-map hooks (accelerate), FSDP and DeepSpeed ZeRO-3 act around whole modules; calling submodules
        # directly would skip them.
        for module in base.modules():
            if hasattr(module, "_hf_hook") or "FullyShardedDataParallel" in type(module).__name__:
                return False
        return not any(hasattr(p, "ds_id") or type(p).__name__ == "DTensor" for p in base.parameters())

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: int) -> torch.Tensor:
        prompts, length = input_ids.shape
        weight = self.base.model.embed_tokens.weight
        dtype = torch.get_autocast_dtype(weight.device.type) if torch.is_autocast_enabled(weight.device.type) \
            else weight.dtype
        shape = (prompts * repeats, self.num_kv_heads, max(1, self.capacity - length), self.head_dim)
        self.keys = [weight.new_empty(shape, dtype=torch.promote_types(dtype, torch.float32)) for _ in self.layers]
        self.values = [weight.new_empty(shape, dtype=dtype) for _ in self.layers]
        self.prompt_keys: list[torch.Tensor] = []
        self.prompt_values: list[torch.Tensor] = []
        self.repeats, self.prompts = repeats, prompts
        self.slots = torch.arange(prompts * repeats, device=input_ids.device)
        padded = not bool(attention_mask.all())
        # Padding keys of each prompt, for the new tokens' attention; None when no prompt is padded.
        self.prompt_padding = ~attention_mask.bool() if padded else None
        positions = positions_from_mask(attention_mask)
        self.next_position = (positions[:, -1] + 1).repeat_interleave(repeats, dim=0)
        self.generated = 0
        mask = None
        if padded:
            # Causal and not a padding key; a padding query also sees itself, so its row is not all -inf (NaN).
            causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
            mask = causal & attention_mask.bool()[:, None, None, :]
            mask |= torch.eye(length, dtype=torch.bool, device=input_ids.device)
        logits = self._forward(input_ids, positions, mask, prefill=True)
        return logits.repeat_interleave(repeats, dim=0) if repeats > 1 else logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        # Each row's prompt padding, shared by every layer's attention this step.
        padding = (None if self.prompt_padding is None
                   else self.prompt_padding[self.slots // self.repeats][:, None, None, :])
        logits = self._forward(tokens[:, None], self.next_position[:, None], padding, prefill=False)
        self.next_position = self.next_position + 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        # Compacted in place and only up to the filled length: no new buffers, and early in a long rollout most of
        # the capacity is still empty. The prompts' part stays as it is.
        count, end = len(rows), self.generated
        for buffers in (self.keys, self.values):
            for i, buffer in enumerate(buffers):
                buffer[:count, :, :end] = buffer[rows, :, :end]
                buffers[i] = buffer[:count]
        self.next_position = self.next_position[rows]
        self.slots = self.slots[rows]

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                 prefill: bool) -> torch.Tensor:
        """Logits of the last position. `mask`: the prompts' attention mask (prefill) or, for one new token, the
        rows' prompt padding (True = padding); None when nothing is padded. `prefill` is explicit, not read from the
        width: a one-token prompt (a one-character text prompt, `max_prompt_length=1`) is a prefill all the same."""
        batch, length = input_ids.shape
        model = self.base.model
        hidden = model.embed_tokens(input_ids)
        cos, sin = model.rotary_emb(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = _rotate(project(attention.q_proj, x).reshape(batch, length, -1, self.head_dim).transpose(1, 2),
                        cos, sin)
            k = _rotate(project(attention.k_proj, x).reshape(batch, length, -1, self.head_dim).transpose(1, 2),
                        cos, sin)
            v = project(attention.v_proj, x).reshape(batch, length, -1, self.head_dim).transpose(1, 2)
            if not prefill:
                self.keys[i][:, :, self.generated] = k[:, :, 0]
                self.values[i][:, :, self.generated] = v[:, :, 0]
                out = self._attend_one(q, i, mask)
            else:  # the prompts
                self.prompt_keys.append(k.to(self.keys[i].dtype).contiguous())
                self.prompt_values.append(v.to(self.values[i].dtype).contiguous())
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                     scale=self.scaling, enable_gqa=self.groups > 1)
                out = out.transpose(1, 2).reshape(batch, length, -1)
            hidden = hidden + project(attention.o_proj, out)
            x = layer.post_attention_layernorm(hidden)
            mlp = layer.mlp  # Llama/Qwen2 MLP: down(act(gate(x)) * up(x))
            hidden = hidden + project(mlp.down_proj, mlp.act_fn(project(mlp.gate_proj, x)) * project(mlp.up_proj, x))
        if not prefill:
            self.generated += 1
        return project(self.base.lm_head, model.norm(hidden[:, -1]))

    def _by_prompt(self, per_row: torch.Tensor) -> torch.Tensor:
        """(rows, kv_heads, groups, n) -> (prompts, kv_heads, N * groups, n): each prompt's samples stacked."""
        rows, heads, groups, n = per_row.shape
        if rows != self.prompts * self.repeats:  # some rows finished: put the rest back in their slots
            grid = per_row.new_zeros(self.prompts * self.repeats, heads, groups, n)
            grid[self.slots] = per_row
            per_row = grid
        return (per_row.view(self.prompts, self.repeats, heads, groups, n).transpose(1, 2)
                .reshape(self.prompts, heads, self.repeats * groups, n))

    def _by_row(self, per_prompt: torch.Tensor) -> torch.Tensor:
        """The inverse of `_by_prompt`, for the rows still decoding."""
        prompts, heads, _, n = per_prompt.shape
        grid = (per_prompt.view(prompts, heads, self.repeats, self.groups, n).transpose(1, 2)
                .reshape(prompts * self.repeats, heads, self.groups, n))
        return grid if len(self.slots) == len(grid) else grid[self.slots]

    def _attend_one(self, q: torch.Tensor, layer: int, padding: torch.Tensor | None) -> torch.Tensor:
        """One new token's query (rows, heads, 1, d) against the prompt part and the generated part."""
        rows = q.shape[0]
        q = q.reshape(rows, self.num_kv_heads, self.groups, self.head_dim)
        prompt_keys, prompt_values = self.prompt_keys[layer], self.prompt_values[layer]
        new_keys = self.keys[layer][:, :, :self.generated + 1]
        new_values = self.values[layer][:, :, :self.generated + 1]
        # Under autocast a matmul would round the scores to bf16 (8 significant bits) before the softmax.
        device = q.device.type
        with torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext():
            q = q.to(new_keys.dtype)
            prompt_scores = self._by_row(torch.matmul(self._by_prompt(q), prompt_keys.transpose(-1, -2)))
            scores = torch.cat([prompt_scores, torch.matmul(q, new_keys.transpose(-1, -2))], dim=-1)
        scores = scores * self.scaling
        prompt_length = prompt_keys.shape[2]
        if padding is not None:
            scores[..., :prompt_length].masked_fill_(padding, float("-inf"))
        probs = scores.softmax(-1).to(new_values.dtype)
        out = torch.matmul(probs[..., prompt_length:], new_values)
        out = out + self._by_row(torch.matmul(self._by_prompt(probs[..., :prompt_length].contiguous()),
                                              prompt_values))
        return out.reshape(rows, 1, -1)


def decoder_for(model: torch.nn.Module, capacity: int) -> LlamaDecoder | TransformersDecoder:
    """The fastest decoder that supports `model`; `capacity` is the longest sequence (prompt + completion)."""
    if os.environ.get("A2PO_DECODER", "auto") != "transformers" and LlamaDecoder.supports(model):
        return LlamaDecoder(model, capacity)
    return TransformersDecoder(model)
