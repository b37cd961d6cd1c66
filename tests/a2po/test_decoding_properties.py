"""Differential tests of the rollout decoders on drawn inputs: every step's logits against the model's own full
forward on the same tokens, and greedy `sample_completions` against `model.generate(do_sample=False)`.

Drawn: prompt lengths from 1 (a one-token prompt must not take the one-token decode branch), mixed left padding,
extra all-padding columns, batch sizes, N samples per prompt (rows beyond `project`'s `FEW_ROWS` too), rows
finishing at any step (at the first generated token as well), `max_completion_length` from 1, Llama and Qwen2, tied
and untied embeddings, grouped-query ratios 1, 2, 4 and 8, LoRA off, on and disabled; both decoders.

What they found: a prompt batch one token wide (one-character text prompts without a chat template, any
prompt under `max_prompt_length=1`) took `LlamaDecoder`'s one-token decode branch in the prefill: with N > 1 "The
expanded size of the tensor (B*N) must match the existing size (B)", with N = 1 an IndexError on the empty prompt
cache. Fixed by telling `_forward` which call is the prefill rather than reading it from the width. Nothing else in
5000 examples a test of the long profile.

Profiles (Hypothesis): "ci", the default, runs a bounded, derandomized set of examples (reproducible, no example
database); "long" draws many more, fresh each run:

    HYPOTHESIS_PROFILE=long OMP_NUM_THREADS=1 .venv/bin/pytest -q tests/a2po/test_decoding_properties.py

(5000 examples a test, ~10 minutes on 2 cores; add `--hypothesis-show-statistics` to see what was drawn). A failure
prints the shrunk input and a `@reproduce_failure` blob to paste above the test.
"""

from __future__ import annotations

import functools
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from datasets import Dataset
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from a2po import A2POConfig, A2POTrainer
from a2po.core import completion_mask
from a2po.decoding import FEW_ROWS, LlamaDecoder, TransformersDecoder, positions_from_mask
from a2po.rollout import sample_completions
from a2po.testing import make_tiny_model

settings.register_profile("ci", max_examples=200, derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=5000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

VOCAB = 104  # the character tokenizer's size (checked below)
PAD, EOS, END = 0, 1, 6  # <pad>, <eos>, <|end|>
ATOL = 1e-4  # fp32: the fast path differs from the model's forward only in summation order
HEADS = [(4, 4), (4, 2), (4, 1), (8, 1)]  # (query heads, key/value heads): GQA ratios 1, 2, 4, 8


@functools.cache
def tiny(arch: str, tied: bool, heads: tuple[int, int], lora: bool) -> torch.nn.Module:
    """One model per configuration, built once (hypothesis draws many inputs for each)."""
    model, tokenizer = make_tiny_model(arch=arch, seed=7, num_heads=heads[0], num_kv_heads=heads[1],
                                       tie_word_embeddings=tied)
    assert len(tokenizer) == VOCAB
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 init_lora_weights=False))
    return model.eval()


@dataclass(frozen=True)
class Model:
    """A drawn configuration (its repr is what a failing example prints); `model` and `adapters()` to use it."""

    arch: str
    tied: bool
    heads: tuple[int, int]
    lora: str  # "off", "on", or "disabled": adapters present but switched off (the reference policy in LoRA runs)

    @property
    def model(self) -> torch.nn.Module:
        return tiny(self.arch, self.tied, self.heads, self.lora != "off")

    def adapters(self):
        return self.model.disable_adapter() if self.lora == "disabled" else nullcontext()


models = st.builds(Model, st.sampled_from(["llama", "qwen2"]), st.booleans(), st.sampled_from(HEADS),
                   st.sampled_from(["off", "on", "disabled"]))


@st.composite
def prompt_batches(draw, max_batch: int = 4, max_length: int = 8):
    """Left-padded (input_ids, attention_mask): each row 1..max_length real tokens, plus 0-2 padding columns for all.
    Under the padding lies the pad id or another token: what is masked must not matter."""
    lengths = draw(st.lists(st.integers(1, max_length), min_size=1, max_size=max_batch))
    width = max(lengths) + draw(st.integers(0, 2))
    ids = torch.full((len(lengths), width), draw(st.sampled_from([PAD, EOS, 42])))
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.tensor(draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n)))
        mask[i, width - n:] = 1
    event("one-token prompts" if width == 1 else "padded" if not mask.all() else "unpadded")
    return ids, mask


def full_forward_logits(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The model's own forward, no cache: the last position's logits of each left-padded row."""
    return model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, -1]


@given(models, prompt_batches(max_batch=5), st.integers(1, 12), st.integers(1, 6), st.booleans(), st.data())
def test_decoder_logits_match_the_full_forward_every_step(case, batch, repeats, steps, fast, data):
    """Prefill, then feed drawn tokens while drawn rows finish (right after the prefill too): every call's logits are
    the full forward's on the same sequences. This is the sampled path, whatever the sampler picks."""
    model = case.model
    ids, mask = batch
    decoder = LlamaDecoder(model, ids.shape[1] + steps) if fast else TransformersDecoder(model)
    rows = torch.arange(len(ids) * repeats)  # original row of each row still decoding
    generated = torch.empty(len(rows), 0, dtype=torch.long)
    if len(rows) > FEW_ROWS:
        event("more rows than FEW_ROWS")
    with torch.no_grad(), case.adapters():
        logits = decoder.prefill(ids, mask, repeats)
        for step in range(steps):
            expected = full_forward_logits(
                model, torch.cat([ids[rows // repeats], generated], 1),
                torch.cat([mask[rows // repeats], torch.ones_like(generated)], 1))
            assert logits.shape == expected.shape
            torch.testing.assert_close(logits, expected, atol=ATOL, rtol=1e-4,
                                       msg=lambda m, step=step: f"step {step}: {m}")
            if step == steps - 1:
                break
            alive = torch.tensor(data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows))))
            if not alive.any():
                break
            tokens = torch.tensor(data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=len(rows),
                                                     max_size=len(rows))))
            if not alive.all():
                event("rows finished at the first generated token" if step == 0 else "rows finished later")
                keep = alive.nonzero().squeeze(-1)
                decoder.select(keep)
                rows, generated, tokens = rows[keep], generated[keep], tokens[keep]
            generated = torch.cat([generated, tokens[:, None]], 1)
            logits = decoder.step(tokens)


def assert_same_greedy_tokens(model, ids, mask, ours: torch.Tensor, reference: torch.Tensor, eos: list[int]):
    """Row by row, the same tokens up to each row's EOS. At a first difference the reference's two best logits
    must be a near tie (within float rounding of the two forwards), which `argmax` may break either way."""
    for row in range(len(ours)):
        a = ours[row][completion_mask(ours[row:row + 1], eos)[0].bool()]
        b = reference[row][completion_mask(reference[row:row + 1], eos)[0].bool()]
        if torch.equal(a, b):
            continue
        at = next((t for t in range(min(len(a), len(b))) if a[t] != b[t]), min(len(a), len(b)))
        assert at < min(len(a), len(b)), f"row {row}: {a.tolist()} vs {b.tolist()}"
        real = mask[row].bool()
        logits = full_forward_logits(model, torch.cat([ids[row][real], b[:at]])[None],
                                     torch.ones(1, int(real.sum()) + at, dtype=torch.long))[0]
        top = logits.topk(2).values
        event("greedy tokens differ at a near tie")
        assert top[0] - top[1] < 10 * ATOL, f"row {row} differs at token {at}: {a.tolist()} vs {b.tolist()}"


@given(models, prompt_batches(max_batch=3), st.integers(1, 4), st.integers(1, 10), st.sampled_from(
    ["model", "first token of row 0", "none"]))
def test_greedy_completions_are_generates(case, batch, num_samples, max_new_tokens, eos_choice):
    """Greedy `sample_completions` (the fast decoder, N samples, finished rows dropped) gives `generate`'s tokens."""
    model = case.model
    ids, mask = batch
    with torch.no_grad(), case.adapters():
        eos = {"model": [EOS, END], "none": [VOCAB]}.get(eos_choice)
        if eos is None:  # row 0 ends at its first generated token; the others may too, or run on
            eos = [int(full_forward_logits(model, ids[:1], mask[:1]).argmax())]
        ours = sample_completions(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_ids=eos,
                                  pad_token_id=PAD, num_samples=num_samples, do_sample=False)
        reference = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                   do_sample=False, eos_token_id=eos, pad_token_id=PAD)[:, ids.shape[1]:]
        assert ours.shape[1] <= max_new_tokens and ours.shape[0] == len(ids) * num_samples
        reference = reference.repeat_interleave(num_samples, 0)
        width = max(ours.shape[1], reference.shape[1])
        ours = torch.nn.functional.pad(ours, (0, width - ours.shape[1]), value=PAD)
        reference = torch.nn.functional.pad(reference, (0, width - reference.shape[1]), value=PAD)
        assert_same_greedy_tokens(model, ids.repeat_interleave(num_samples, 0), mask.repeat_interleave(num_samples, 0),
                                  ours, reference, eos)
        # After a row's EOS it holds padding; without EOS it runs to max_new_tokens.
        assert (ours[completion_mask(ours, eos) == 0] == PAD).all()
        if eos_choice == "first token of row 0":
            assert (ours[:num_samples, 0] == eos[0]).all() and (ours[:num_samples, 1:] == PAD).all()


# ------------------------------------------------------------------------------------------------------------------
# The two triggers of the one-token prompt crash, as plain regression tests.

def one_token_config(tmp_path, **overrides) -> A2POConfig:
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=1, num_value_samples=4,
                  max_completion_length=5, use_cpu=True, report_to="none", save_strategy="no", seed=0,
                  disable_tqdm=True, filter_all_incorrect=False)
    values.update(overrides)
    return A2POConfig(**values)


def any_reward(completions, **kwargs):
    return [float(len(c if isinstance(c, str) else c[0]["content"]) % 2) for c in completions]


def test_one_character_prompts_without_a_chat_template_go_through_both_stages(tmp_path, tiny_model_dir):
    """"7" tokenizes to one token: stage 1 (N samples) and stage 2 (one sample) both prefill a width-1 batch."""
    data = Dataset.from_list([{"prompt": str(i)} for i in range(4)])
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=any_reward, args=one_token_config(tmp_path),
                          train_dataset=data)
    ids, _, _ = trainer._encode_prompts(data["prompt"])
    assert ids.shape == (4, 1)
    table = trainer.estimate_optimal_values()
    assert len(table) == 4 and all(len(c) == 4 for c in table["completions"])
    assert trainer.train().global_step == 1


def test_any_prompt_under_max_prompt_length_one_decodes(tmp_path, tiny_model_dir):
    """max_prompt_length=1 (the form allows it) cuts every prompt to its last token: training and evaluation run."""
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(4)])
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=any_reward, train_dataset=data, eval_dataset=data,
                          args=one_token_config(tmp_path, max_prompt_length=1))
    ids, mask, _ = trainer._encode_prompts(data["prompt"])
    assert ids.shape == (4, 1) and mask.all()
    assert trainer.train().global_step == 1
    assert 0.0 <= trainer.evaluate()["eval_accuracy"] <= 1.0


def test_one_token_prompts_decode_like_the_full_forward():
    """The smallest case of the property above, kept explicit: width-1 prompts, 2 samples each, both decoders."""
    model = tiny("llama", True, (4, 2), False)
    ids, mask = torch.tensor([[20], [30]]), torch.ones(2, 1, dtype=torch.long)
    for decoder in (LlamaDecoder(model, 4), TransformersDecoder(model)):
        with torch.no_grad():
            first = decoder.prefill(ids, mask, 2)
            second = decoder.step(torch.tensor([40, 41, 42, 43]))
            expected = full_forward_logits(model, torch.tensor([[20, 40], [20, 41], [30, 42], [30, 43]]),
                                           torch.ones(4, 2, dtype=torch.long))
        torch.testing.assert_close(first, full_forward_logits(model, ids, mask).repeat_interleave(2, 0), atol=ATOL,
                                   rtol=1e-4)
        torch.testing.assert_close(second, expected, atol=ATOL, rtol=1e-4)
