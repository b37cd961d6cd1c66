"""The Llama-family rollout decoder against the model's own forward: same logits every step, with padding, repeated
prompts, dropped rows, LoRA adapters on and off; other architectures fall back to the model's forward."""

from contextlib import nullcontext

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config

from a2po.decoding import LlamaDecoder, TransformersDecoder, decoder_for
from a2po.rollout import sample_completions
from a2po.testing import make_tiny_model

PROMPTS = ("What is 12 + 7?", "1+1", "Say something long please")


def padded_batch(tokenizer):
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in PROMPTS]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)


def step_logits(decoder, input_ids, attention_mask, repeats, tokens_per_step, drop_at):
    """Prefill, then feed the given tokens; at step `drop_at` rows 1, 4, 7, ... finish. Logits of every call."""
    out = [decoder.prefill(input_ids, attention_mask, repeats)]
    keep = None
    for step, tokens in enumerate(tokens_per_step):
        if step == drop_at:  # rows 1, 4, 7, ... finish: prompts are left with different numbers of samples
            keep = (torch.arange(len(tokens)) % 3 != 1).nonzero().squeeze(-1)
            decoder.select(keep)
        out.append(decoder.step(tokens if keep is None else tokens[keep]))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("padded", [True, False])
def test_llama_decoder_gives_the_model_forward_logits_every_step(arch, padded):
    model, tokenizer = make_tiny_model(arch=arch, seed=2)
    model.eval()
    batch = padded_batch(tokenizer)
    ids, mask = batch.input_ids, batch.attention_mask
    if not padded:
        ids, mask = ids[:, -5:], torch.ones_like(mask[:, -5:])
    assert LlamaDecoder.supports(model)
    repeats, steps = 2, 6
    decoder = LlamaDecoder(model, ids.shape[1] + steps)
    tokens = [torch.randint(7, len(tokenizer), (len(ids) * repeats,), generator=torch.Generator().manual_seed(s))
              for s in range(steps)]
    with torch.no_grad():
        fast = step_logits(decoder, ids, mask, repeats, tokens, drop_at=3)
        plain = step_logits(TransformersDecoder(model), ids, mask, repeats, tokens, drop_at=3)
    assert [f.shape for f in fast] == [p.shape for p in plain]
    assert fast[-1].shape[0] == 4  # of 3 prompts x 2 samples
    for f, p in zip(fast, plain):
        torch.testing.assert_close(f, p, atol=2e-5, rtol=1e-4)
    # Each prompt's keys and values are stored once, not once per sample.
    assert decoder.prompt_keys[0].shape[0] == len(ids) and decoder.keys[0].shape[2] == steps


def test_llama_decoder_follows_lora_adapters_on_and_off():
    from peft import LoraConfig, get_peft_model

    model, tokenizer = make_tiny_model(seed=3)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    model.eval()
    batch = padded_batch(tokenizer)
    assert LlamaDecoder.supports(model)
    tokens = [torch.full((3,), 9)]
    first_logits = {}
    with torch.no_grad():
        for adapters in (True, False):
            with nullcontext() if adapters else model.disable_adapter():
                fast = step_logits(LlamaDecoder(model, 64), batch.input_ids, batch.attention_mask, 1, tokens, -1)
                plain = step_logits(TransformersDecoder(model), batch.input_ids, batch.attention_mask, 1, tokens, -1)
            for f, p in zip(fast, plain):
                torch.testing.assert_close(f, p, atol=2e-5, rtol=1e-4)
            first_logits[adapters] = fast[0]
    assert not torch.allclose(first_logits[True], first_logits[False], atol=1e-3)  # the adapters do act


def test_llama_decoder_under_bf16_autocast_stays_close_to_the_model():
    model, tokenizer = make_tiny_model(seed=4)
    model.eval()
    batch = padded_batch(tokenizer)
    tokens = [torch.full((6,), 11), torch.full((6,), 12)]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast = step_logits(LlamaDecoder(model, 64), batch.input_ids, batch.attention_mask, 2, tokens, -1)
        plain = step_logits(TransformersDecoder(model), batch.input_ids, batch.attention_mask, 2, tokens, -1)
    for f, p in zip(fast, plain):
        assert f.dtype == p.dtype
        torch.testing.assert_close(f.float(), p.float(), atol=0.1, rtol=0.05)



def test_llama_decoder_scores_a_step_in_fp32_under_bf16_autocast():
    """The scores reach the softmax as fp32 products of the bf16 query and keys (as in the fused attention kernels of
    the training forward), not rounded to bf16 first; the step's output stays in the compute dtype."""
    from torch.overrides import TorchFunctionMode

    model, tokenizer = make_tiny_model(seed=4)
    batch = padded_batch(tokenizer)
    decoder = LlamaDecoder(model.eval(), 64)
    generator = torch.Generator().manual_seed(0)
    softmax_inputs = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.softmax:
                softmax_inputs.append(args[0].detach().clone())
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        decoder.prefill(batch.input_ids, batch.attention_mask, 2)
        rows, kv_heads, groups, d = 6, decoder.num_kv_heads, decoder.groups, decoder.head_dim
        decoder.keys[0][:, :, 0] = torch.randn(rows, kv_heads, d, generator=generator).bfloat16()
        decoder.values[0][:, :, 0] = torch.randn(rows, kv_heads, d, generator=generator).bfloat16()
        # Scores of tens of units, where bf16 keeps about a tenth of a unit.
        q = (8 * torch.randn(rows, kv_heads * groups, 1, d, generator=generator)).bfloat16()
        padding = decoder.prompt_padding[decoder.slots // decoder.repeats][:, None, None, :]
        with Spy():
            out = decoder._attend_one(q, 0, padding)
    keys = torch.cat([decoder.prompt_keys[0].repeat_interleave(2, 0), decoder.keys[0][:, :, :1]], 2).double()
    values = torch.cat([decoder.prompt_values[0].repeat_interleave(2, 0), decoder.values[0][:, :, :1]], 2).double()
    expected = q.double().reshape(rows, kv_heads, groups, d) @ keys.transpose(-1, -2) * decoder.scaling
    expected[..., :-1] = expected[..., :-1].masked_fill(padding, float("-inf"))
    (scores,) = softmax_inputs
    assert scores.dtype == torch.float32 and expected[expected.isfinite()].abs().max() > 20
    assert torch.equal(scores.isfinite(), expected.isfinite())
    assert (scores.double() - expected)[expected.isfinite()].abs().max() < 1e-3
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), (expected.softmax(-1) @ values).reshape(rows, 1, -1), atol=0.05, rtol=0.02)

def test_other_architectures_and_sliding_windows_use_the_model_forward(monkeypatch):
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2,
                                                       eos_token_id=1, pad_token_id=0))
    assert isinstance(decoder_for(gpt2, 16), TransformersDecoder)
    sliding = AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, use_sliding_window=True, sliding_window=4, max_window_layers=0))
    assert not LlamaDecoder.supports(sliding)
    model, _ = make_tiny_model()
    assert isinstance(decoder_for(model, 16), LlamaDecoder)
    monkeypatch.setenv("A2PO_DECODER", "transformers")
    assert isinstance(decoder_for(model, 16), TransformersDecoder)


def test_unsupported_architecture_still_samples_like_generate():
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2,
                                                       eos_token_id=1, pad_token_id=0)).eval()
    ids = torch.randint(2, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ours = sample_completions(gpt2, ids, mask, max_new_tokens=8, eos_token_ids=[1], pad_token_id=0, do_sample=False)
    reference = gpt2.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                              eos_token_id=1, pad_token_id=0)[:, 5:]
    width = ours.shape[1]
    assert torch.equal(ours, reference[:, :width])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 8, 32, 33])
def test_project_is_the_linear_layer(bias, rows):
    from a2po.decoding import project

    linear = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(rows, 1, 48, generator=torch.Generator().manual_seed(rows))
    out = project(linear, x)
    assert out.shape == (rows, 1, 80)
    torch.testing.assert_close(out, linear(x), atol=1e-5, rtol=1e-5)

    class Wrapped(torch.nn.Linear):  # e.g. an adapter layer: called as it is
        def forward(self, x):
            return super().forward(x) + 1

    wrapped = Wrapped(48, 80, bias=bias)
    assert torch.equal(project(wrapped, x), wrapped(x))
