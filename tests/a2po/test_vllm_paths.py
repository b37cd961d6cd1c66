"""The vLLM paths only a GPU exercises, checked on the CPU without vLLM (issue 46): a recording stand-in for vLLM's
`LLM` and for the trainer's engine, real trainers, real peft and `torch.compile` (backend "eager").

What they pin down: sleep mode wakes after `torch.cuda.empty_cache()`; a compiled model pushes plain names and keeps
the native decoder and `logits_to_keep`; LoRA pushes what peft's merge gives (DoRA, `modules_to_save`); a GPU engine
is released after `train()`; the decode time leaves out the engine's start and the weight push; the engine's config
folder is private to the user."""

from __future__ import annotations

import copy
import os
import stat
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from a2po import A2POConfig, A2POTrainer, vllm_engine
from a2po.decoding import LlamaDecoder, accepts, decoder_for
from a2po.testing import make_tiny_model


class RecordingLLM:
    """What `VLLMEngine` calls on vLLM's `LLM`, in order."""

    def __init__(self, calls):
        self.calls = calls

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def collective_rpc(self, name, kwargs):
        list(kwargs["weights_iterator"])
        self.calls.append(("rpc", name))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests, params, use_tqdm):
        self.calls.append(("generate", len(requests)))
        completion = SimpleNamespace(token_ids=[5, 1], logprobs=None)
        return [SimpleNamespace(outputs=[completion]) for _ in requests]


def sleeping_engine(calls):
    engine = object.__new__(vllm_engine.VLLMEngine)  # no vLLM here: the engine without its start
    engine.llm, engine.asleep, engine.weights_key = RecordingLLM(calls), True, None
    engine.settings = vllm_engine.EngineSettings("m", "bfloat16", options=(("enable_sleep_mode", True),))
    return engine


def test_sleep_mode_empties_the_cuda_cache_before_each_wake_up(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    engine = sleeping_engine(calls)
    engine.load_weights(iter([("w", torch.zeros(2))]), key="k")
    assert calls[:2] == [("empty_cache",), ("wake_up", ("weights",))]
    calls.clear()
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **settings: settings))
    out, _ = engine.generate([[3, 4]], num_samples=2, max_new_tokens=2, eos_token_ids=[1], pad_token_id=0)
    assert calls == [("empty_cache",), ("wake_up", ("kv_cache",)), ("generate", 2), ("sleep", 2)]
    assert out.tolist() == [[5, 1], [5, 1]]


def test_a_compiled_model_pushes_plain_names_and_keeps_the_native_decoder():
    model, _ = make_tiny_model(None)
    compiled = torch.compile(model, backend="eager")
    plain = dict(vllm_engine.merged_weights(model))
    pushed = dict(vllm_engine.merged_weights(compiled))
    assert list(pushed) == list(plain) and all(torch.equal(pushed[k], plain[k]) for k in plain)
    assert isinstance(decoder_for(compiled, 32), LlamaDecoder)
    assert accepts(compiled, "logits_to_keep")  # the log-prob pass keeps only the completion's logits


@pytest.mark.parametrize("variant", ["lora", "dora", "modules_to_save"])
def test_a_lora_policy_pushes_peft_merge_and_its_reference_the_base_weights(variant):
    """The push equals `merge_and_unload()` of the trained adapters; with adapters off, the untouched base."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base, _ = make_tiny_model(None, tie_word_embeddings=False)
    plain = {k: v.clone() for k, v in base.state_dict().items()}
    extra = {"lora": {}, "dora": {"use_dora": True}, "modules_to_save": {"modules_to_save": ["lm_head"]}}[variant]
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **extra))
    with torch.no_grad():  # as after training: adapters, DoRA magnitudes and the saved copies moved
        for _, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    pushed = dict(vllm_engine.merged_weights(model))
    with model.disable_adapter():
        reference = dict(vllm_engine.merged_weights(model))
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(pushed) == set(reference) == set(plain)
    assert max((pushed[k] - merged[k]).abs().max().item() for k in plain) < 1e-6
    assert all(torch.equal(reference[k], plain[k]) for k in plain)
    assert any(not torch.equal(pushed[k], plain[k]) for k in plain)


class FakeEngine:
    """The trainer's engine: records pushes and samplings, takes `push_seconds` per push, samples random tokens."""

    def __init__(self, device, push_seconds=0.0):
        self.device, self.push_seconds = device, push_seconds
        self.weights_key, self.events = None, []

    def load_weights(self, weights, key):
        list(weights)
        time.sleep(self.push_seconds)
        self.weights_key = key
        self.events.append("push")

    def generate(self, prompts, *, num_samples, max_new_tokens, eos_token_ids, pad_token_id, logprobs=False, **kw):
        self.events.append("generate")
        out = torch.randint(7, 40, (len(prompts) * num_samples, max_new_tokens))
        out[:, -1] = eos_token_ids[0]
        return out, None

    def shutdown(self):
        self.events.append("shutdown")


def vllm_trainer(tmp_path, monkeypatch, engine):
    monkeypatch.setattr(vllm_engine, "engine_for", lambda settings: engine)
    monkeypatch.setenv("A2PO_CACHE_DIR", str(tmp_path / "cache"))
    make_tiny_model(tmp_path / "m")
    args = A2POConfig(output_dir=str(tmp_path / "out"), num_value_samples=2, max_steps=1, use_cpu=True,
                      per_device_train_batch_size=4, max_completion_length=6, filter_all_incorrect=False,
                      report_to="none", save_strategy="no", disable_tqdm=True)
    args.use_vllm = True  # past the config's "is vLLM installed" check: the engine is the stand-in
    rows = Dataset.from_list([{"prompt": f"{i} + {i} ="} for i in range(4)])
    return A2POTrainer(str(tmp_path / "m"), lambda completions, **kw: [1.0] * len(completions), args=args,
                       train_dataset=rows)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_gpu_engine_is_released_after_train(tmp_path, monkeypatch, device):
    engine = FakeEngine(device)
    trainer = vllm_trainer(tmp_path, monkeypatch, engine)
    trainer.train()
    assert ("shutdown" in engine.events) is (device == "cuda")
    assert (trainer._vllm is None) is (device == "cuda")  # a CPU engine stays for the next trainer


def test_decode_seconds_leave_out_the_weight_push(tmp_path, monkeypatch):
    trainer = vllm_trainer(tmp_path, monkeypatch, FakeEngine("cpu", push_seconds=0.3))
    trainer.train()
    values, train = trainer.rollout_stats["values"], trainer.rollout_stats["train"]
    assert values["weight_push_seconds"] >= 0.3 and train["weight_push_seconds"] >= 0.3
    assert values["seconds"] < 0.3 and train["seconds"] < 0.3
    assert "engine_start_seconds" in values


def test_the_engine_config_folder_is_private_to_the_user(tmp_path, monkeypatch):
    monkeypatch.setenv("A2PO_CACHE_DIR", str(tmp_path))
    folder = vllm_engine.config_folder('{"a": 1}')
    assert folder.parent == tmp_path / "vllm" and (folder / "config.json").read_text() == '{"a": 1}'
    for path in (folder, folder.parent):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert vllm_engine.config_folder('{"a": 1}') == folder  # reused as it is
    (folder / "config.json").write_text('{"planted": 1}')
    assert (vllm_engine.config_folder('{"a": 1}') / "config.json").read_text() == '{"a": 1}'


def test_a_planted_config_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("A2PO_CACHE_DIR", str(tmp_path))
    text = '{"b": 2}'
    folder = vllm_engine.config_folder(text)
    folder.chmod(0o777)  # as another user (or a umask of 0) could have left it: anyone may add files
    with pytest.raises(PermissionError, match="can be entered or written by others .mode 777.*Remove it"):
        vllm_engine.config_folder(text)
    folder.chmod(0o700)
    os.rename(folder, tmp_path / "elsewhere")
    folder.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="is not a plain folder"):
        vllm_engine.config_folder(text)
    uid = os.geteuid()
    monkeypatch.setattr(vllm_engine.os, "geteuid", lambda: uid + 1)  # every folder now looks like another's
    with pytest.raises(PermissionError, match="belongs to another user"):
        vllm_engine.config_folder('{"c": 3}')
