"""The fast rollout path against plain decoding: same tokens greedily, same tokens from the same random stream."""

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from a2po.core import completion_mask
from a2po.rollout import positions_from_mask, process_logits, sample_completions, sample_tokens, sequence_logprobs
from a2po.testing import make_tiny_model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_batch(request):
    model, tokenizer = make_tiny_model(arch=request.param, seed=1)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ("What is 12 + 7?", "1+1", "Say something long please")]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return model.eval(), tokenizer, batch


def naive_sample(model, input_ids, attention_mask, num_samples, steps, eos, generator, **sampling):
    """Reference: expand prompts, recompute the whole sequence every step (no cache), same sampling function."""
    ids = input_ids.repeat_interleave(num_samples, 0)
    mask = attention_mask.repeat_interleave(num_samples, 0)
    done = torch.zeros(len(ids), dtype=torch.bool)
    out = []
    for _ in range(steps):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, -1]
        token = sample_tokens(process_logits(logits, **sampling).softmax(-1), generator)
        token = torch.where(done, torch.zeros_like(token), token)
        out.append(token)
        done |= torch.isin(token, torch.tensor(eos))
        ids, mask = torch.cat([ids, token[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(out, 1)


def test_greedy_matches_generate(model_and_batch):
    model, tokenizer, batch = model_and_batch
    eos = model.generation_config.eos_token_id
    ours = sample_completions(model, batch.input_ids, batch.attention_mask, max_new_tokens=24, eos_token_ids=eos,
                              pad_token_id=tokenizer.pad_token_id, do_sample=False, num_samples=2)
    reference = model.generate(**batch, max_new_tokens=24, do_sample=False)[:, batch.input_ids.shape[1]:]
    reference = reference * completion_mask(reference, eos)  # generate pads after EOS with pad id 0 too
    reference = reference.repeat_interleave(2, 0)
    width = min(ours.shape[1], reference.shape[1])
    assert torch.equal(ours[:, :width], reference[:, :width])
    assert (ours[:, width:] == tokenizer.pad_token_id).all() and (reference[:, width:] == 0).all()


@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}])
def test_sampling_draws_the_same_tokens_as_plain_decoding(model_and_batch, sampling):
    model, _, batch = model_and_batch
    no_eos = [-1]  # no row ends, so both paths consume the random stream identically for all 16 steps
    ours = sample_completions(model, batch.input_ids, batch.attention_mask, max_new_tokens=16, eos_token_ids=no_eos,
                              pad_token_id=0, num_samples=4, generator=torch.Generator().manual_seed(3), **sampling)
    with torch.no_grad():
        plain = naive_sample(model, batch.input_ids, batch.attention_mask, 4, 16, no_eos,
                             torch.Generator().manual_seed(3), **sampling)
    assert ours.shape == (12, 16) and torch.equal(ours, plain)


def test_sample_tokens_draws_from_the_given_distribution():
    probs = torch.tensor([0.05, 0.0, 0.15, 0.3, 0.0, 0.5]).repeat(200_000, 1)
    drawn = sample_tokens(probs, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(drawn, minlength=6).double() / len(drawn)
    # 200k draws: the standard error of each frequency is below 0.0012; zero-probability tokens never appear.
    assert torch.allclose(frequencies, probs[0].double(), atol=0.005)
    assert frequencies[1] == 0 and frequencies[4] == 0
    unnormalised = sample_tokens(torch.tensor([[0.0, 3.0, 0.0]] * 100), torch.Generator().manual_seed(1))
    assert (unnormalised == 1).all()


def test_rows_hold_padding_after_their_first_eos(model_and_batch):
    model, tokenizer, batch = model_and_batch
    eos = model.generation_config.eos_token_id
    torch.manual_seed(0)
    out = sample_completions(model, batch.input_ids, batch.attention_mask, max_new_tokens=40, eos_token_ids=eos,
                             pad_token_id=tokenizer.pad_token_id, num_samples=8)
    mask = completion_mask(out, eos)
    assert (out[mask == 0] == tokenizer.pad_token_id).all()


def test_process_logits_matches_transformers_warpers():
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    expected = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(10)(None, logits / 0.7))
    ours = process_logits(logits, temperature=0.7, top_k=10, top_p=0.8)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    assert torch.allclose(ours[~torch.isinf(ours)], expected[~torch.isinf(expected)])


def test_sequence_logprobs_matches_full_forward(model_and_batch):
    model, tokenizer, batch = model_and_batch
    eos = model.generation_config.eos_token_id
    completions = sample_completions(model, batch.input_ids, batch.attention_mask, max_new_tokens=10,
                                     eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id)
    mask = completion_mask(completions, eos)
    ours = sequence_logprobs(model, batch.input_ids, batch.attention_mask, completions, mask)
    for i in range(len(completions)):  # one unpadded row at a time, full-vocabulary log-softmax
        prompt = batch.input_ids[i][batch.attention_mask[i] == 1]
        completion = completions[i][mask[i] == 1]
        ids = torch.cat([prompt, completion])[None]
        logps = model(input_ids=ids).logits[0, len(prompt) - 1:-1].log_softmax(-1)
        expected = logps.gather(-1, completion[:, None]).sum()
        assert ours[i].item() == pytest.approx(expected.item(), abs=1e-4)


def test_row_keys_make_each_sequence_independent_of_its_batch(model_and_batch):
    model, _, batch = model_and_batch
    input_ids, attention_mask = batch.input_ids, batch.attention_mask
    sampling = dict(max_new_tokens=6, eos_token_ids=[1], pad_token_id=0, num_samples=2)
    keys = [("seed", i, j) for i in range(input_ids.shape[0]) for j in range(2)]
    together = sample_completions(model, input_ids, attention_mask, row_keys=keys, **sampling)
    torch.rand(100)  # the global stream moved
    for i in range(input_ids.shape[0]):  # each prompt alone (no padding), with its own keys: the same tokens
        ids = input_ids[i][attention_mask[i].bool()][None]
        alone = sample_completions(model, ids, torch.ones_like(ids), row_keys=keys[2 * i:2 * i + 2], **sampling)
        width = alone.shape[1]
        assert torch.equal(alone, together[2 * i:2 * i + 2, :width])
        assert (together[2 * i:2 * i + 2, width:] == 0).all()
    other = sample_completions(model, input_ids, attention_mask, row_keys=[(*k, "x") for k in keys], **sampling)
    assert not torch.equal(other, together)
    with pytest.raises(ValueError, match="one key per sequence"):
        sample_completions(model, input_ids, attention_mask, row_keys=keys[:3], **sampling)


class HostReads:
    """Counts the operations that read tensor values on the host, each of which makes a GPU wait for the device (a
    sync): at the aten level `_local_scalar_dense` (item(), bool(), int() of a tensor), the ops whose output size
    depends on the values (nonzero, masked_select, unique, repeat_interleave by a tensor) and indexing by a boolean
    mask (a nonzero inside); tolist() and numpy() are not aten ops and are counted at the Python level. On a CPU this
    is what the code asks for, not a measurement of a GPU's syncs (an op's own kernels may sync there)."""

    SIZED_BY_VALUES = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                       "unique_consecutive"}

    def __init__(self):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Aten(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name in HostReads.SIZED_BY_VALUES or (
                        name == "repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor")) or (
                        name.startswith("index") and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                         for i in (args[1] if len(args) > 1 else []) or [])):
                    counter.count += 1
                return func(*args, **(kwargs or {}))

        class Python(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in ("tolist", "numpy", "__array__"):
                    counter.count += 1
                return func(*args, **(kwargs or {}))

        self.count = 0
        self.modes = (Python(), Aten())

    def __enter__(self):
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)


def test_host_reads_are_counted():
    with HostReads() as reads:
        x = torch.arange(6)
        bool(x[0]), x.sum().item(), x.tolist(), x.nonzero(), x[x > 2]
        x[x > 4] = 0
        x[torch.tensor([1, 2])], x + 1, len(x)  # neither reads values
    assert reads.count == 6


def test_a_decode_step_reads_the_device_at_most_once(monkeypatch):
    """Sampling (top-k, top-p, greedy rows next to sampled ones) and dropping finished rows need the device's values
    on the host once per step: the rows still decoding. The prefill adds one read (whether any prompt is padded)."""
    from a2po.decoding import LlamaDecoder

    model, tokenizer = make_tiny_model(seed=1)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in ("What is 12 + 7?", "1+1", "Say something long please")]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    marks = []
    step = LlamaDecoder.step
    monkeypatch.setattr(LlamaDecoder, "step", lambda self, tokens: (marks.append(reads.count), step(self, tokens))[1])
    eos = list(range(30, 60))  # about a third of the vocabulary: rows end at different steps
    with HostReads() as reads:
        out = sample_completions(model.eval(), batch.input_ids, batch.attention_mask, max_new_tokens=24,
                                 eos_token_ids=eos, pad_token_id=0, num_samples=4, greedy_samples=1, top_k=40,
                                 top_p=0.95, row_keys=[("k", i) for i in range(12)])
    marks.append(reads.count)
    lengths = completion_mask(out, eos).sum(-1)
    assert len(set(lengths.tolist())) > 2 and out.shape[1] > 3  # rows were dropped at several steps
    assert marks[0] <= 2  # the prefill's padding check and the first step's rows
    assert max(b - a for a, b in zip(marks, marks[1:])) <= 1


@pytest.mark.parametrize("setting", ["fp32", "bf16-autocast", "lora", "temperature-entropy"])
def test_the_lean_head_gives_the_forwards_logprobs_and_gradients(monkeypatch, setting):
    """`lean_head` (issue 46): the body's hidden states, then the output layer a few positions at a time, recomputed
    in the backward pass: the same log-probabilities, entropies and gradients as the model's own forward."""
    import a2po.rollout as rollout

    monkeypatch.setattr(rollout, "HEAD_CHUNK_ELEMENTS", 3 * 100)  # 3 positions a chunk: several chunks per row
    model, _ = make_tiny_model(None, arch="qwen2", tie_word_embeddings=setting != "lora")
    if setting == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 modules_to_save=["lm_head"]))
    model.train()
    dtype = torch.bfloat16 if setting == "bf16-autocast" else None
    temperature, entropy = (0.7, True) if setting == "temperature-entropy" else (1.0, False)
    torch.manual_seed(0)
    prompt = torch.randint(7, 40, (3, 5))
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[0, :2] = 0  # a left-padded row
    completion = torch.randint(7, 40, (3, 6))
    mask = torch.ones_like(completion)
    mask[1, 4:] = 0
    assert rollout.lean_head_supported(model) and not rollout.lean_head_supported(torch.compile(model))

    def run(lean):
        model.zero_grad()
        context = torch.autocast("cpu", dtype=dtype) if dtype and not lean else torch.autocast("cpu", enabled=False)
        with context:
            out = rollout.per_token_logprobs(model, prompt, prompt_mask, completion, mask, temperature=temperature,
                                             with_entropy=entropy, lean_head=lean, autocast_dtype=dtype)
        logps, entropies = out if entropy else (out, None)
        (logps.sum() * 0.5).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logps.detach(), entropies, grads

    plain, plain_entropy, plain_grads = run(lean=False)
    lean, lean_entropy, lean_grads = run(lean=True)
    tolerance = 2e-2 if dtype else 1e-5  # bf16 matmuls: the same operations, summed in another order by chunk
    assert torch.allclose(lean, plain, atol=tolerance, rtol=0) and (lean[mask == 0] == 0).all()
    assert set(lean_grads) == set(plain_grads) and len(lean_grads) > 2
    for name, grad in plain_grads.items():
        assert torch.allclose(lean_grads[name], grad, atol=tolerance, rtol=tolerance), name
    if entropy:
        assert torch.allclose(lean_entropy, plain_entropy, atol=1e-5)
