"""vLLM as the sampler (`use_vllm`): one engine in the training process ("colocate", as TRL names it).

The trainer hands it prompt token ids and gets completion token ids back in the native decoder's layout
(`a2po.rollout.sample_completions`): rows grouped by prompt, padded after each row's first EOS. Everything else
(rewards, V*, filters, the loss's log-probabilities) stays the trainer's own.

Each sampled sequence is its own vLLM request, seeded from its random-stream key (`a2po.rollout.stream_seed`), so
its random draws depend on its key alone (the streams differ from the native decoder's). Its tokens are not
batch-invariant as the native decoder's are: vLLM's batched kernels may round a sequence's logits differently with
the batch around it, and a draw near a boundary can then pick another token, unless vLLM's batch-invariant mode is
on (`VLLM_BATCH_INVARIANT=1`, slower). vLLM's prefix cache still prefills a prompt once for its samples.

The engine holds one set of weights. The trainer pushes the ones it samples from (`load_weights`): the policy's
after each optimizer step and after a resume, the reference's for stage 1; a LoRA policy is pushed merged
(`merged_weights`), leaving the training model as it is. Weights go through the worker's `reload_weights`, which
runs the model's own checkpoint loader on the given tensors (on vLLM's CPU build, calling the model's
`load_weights` outside it fails: the parameters lack their `weight_loader`).

Sleep mode (`vllm_enable_sleep_mode`, as TRL does it): the engine sleeps at level 2 (weights and KV cache freed)
after each sampling, so the optimizer step has the GPU's memory; the next push wakes the weights, the next sampling
the KV cache, each after `torch.cuda.empty_cache()` (as TRL: the caching allocator still holds the step's freed
activations, which vLLM's wake-up would otherwise not find). vLLM has sleep mode on CUDA (and ROCm, XPU) only:
elsewhere the setting is refused.

A GPU engine is shut down at the end of `train()` (`release_engine`), so a notebook gets its GPU memory back; the next
sampling starts a new one. A CPU engine is kept for the process (below).

vLLM builds its model from a config folder private to the user (`config_folder`): mode 0700 under the cache folder
(`$A2PO_CACHE_DIR`, else `~/.cache/a2po`), since vLLM reads it (with `trust_remote_code`, runs its code) and a shared,
predictable name could be planted by another user first.

The engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the weights then reach the worker as tensors,
without serialization. One engine lives per process (`engine_for`): vLLM does not free a CPU engine's memory
reliably, and successive trainers in one process (chunked runs, tests) reuse it.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import stat
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from a2po.rollout import stream_seed
from a2po.settings import engine_arguments


@dataclass(frozen=True)
class EngineSettings:
    """What an engine is built with; an engine is reused only for equal settings."""

    model: str                      # a directory with the model's config.json (`engine_settings`)
    dtype: str                      # "float32", "bfloat16" or "float16": the precision the policy trains in
    # `vllm.LLM`'s arguments from the config's vLLM settings (`a2po.settings.engine_arguments`), as (name, value)
    options: tuple[tuple[str, Any], ...] = ()
    trust_remote_code: bool = False

    @property
    def arguments(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def enable_sleep_mode(self) -> bool:
        return bool(self.arguments.get("enable_sleep_mode", False))


class VLLMEngine:
    """A colocated `vllm.LLM`: `generate` completions, `load_weights` of the model to sample from."""

    started = 0  # engines started in this process

    def __init__(self, settings: EngineSettings) -> None:
        # In-process engine core: weights pass to the worker as tensors, and no child process outlives a run.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm.platforms import current_platform

        sleeps = settings.enable_sleep_mode
        if sleeps and not current_platform.is_sleep_mode_available():
            raise ValueError(f"vllm_enable_sleep_mode needs a GPU (vLLM has no sleep mode on "
                             f"{current_platform.device_name}): set vllm_enable_sleep_mode=False.")
        self.settings = settings
        # An in-process vLLM seeds the global random generators as it starts: the trainer's streams go on as before.
        python_state, numpy_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng():
            self.llm = self._start(settings)
        VLLMEngine.started += 1
        self.device = current_platform.device_type  # "cuda", "cpu", ...: whether `release_engine` frees a GPU
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        # What the engine holds: a key the trainer chooses (`BaseTrainer._vllm_for`), None until weights are pushed.
        self.weights_key: Hashable | None = None
        # Sleep level 2 drops the weights: they must be pushed again before sampling.
        self.asleep = False
        if sleeps:
            self.sleep()

    @staticmethod
    def _start(settings: EngineSettings):
        from vllm import LLM

        return LLM(model=settings.model, dtype=settings.dtype, trust_remote_code=settings.trust_remote_code,
                   **settings.arguments,
                   # Random weights, replaced by the trainer's before any sampling (`engine_settings`).
                   load_format="dummy",
                   # The trainer tokenizes and detokenizes; vLLM sees token ids only.
                   skip_tokenizer_init=True,
                   # Sampling settings are the trainer's alone, not the checkpoint's generation_config.json.
                   generation_config="vllm",
                   # The log-probabilities `generate` returns are of the distribution it sampled from (after
                   # temperature and top-k/top-p), which GRPO's importance-sampling correction needs, as TRL sets.
                   logprobs_mode="processed_logprobs")

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]], key: Hashable) -> None:
        """Replace the engine's weights by `weights` (transformers names and layout, any dtype)."""
        if self.asleep:
            self._wake_up("weights")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        # Cached prompt keys and values were computed with the old weights.
        self.llm.reset_prefix_cache()
        self.weights_key = key

    def _wake_up(self, tag: str) -> None:
        """Wake `tag` ("weights", "kv_cache") up, after handing the caching allocator's free blocks back to CUDA: the
        training step's freed activations stay reserved by torch otherwise, and vLLM's wake-up runs out of memory."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=[tag])

    def shutdown(self) -> None:
        """Stop the engine and free what it holds on the GPU (weights, KV cache)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if callable(getattr(core, "shutdown", None)):
            core.shutdown()
        self.llm = None
        self.weights_key = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def sleep(self) -> None:
        """Free the weights and KV cache until the next sampling (vllm_enable_sleep_mode; level 2, as TRL)."""
        self.llm.sleep(level=2)
        self.asleep = True
        self.weights_key = None

    def generate(self, prompts: Sequence[Sequence[int]], *, num_samples: int, max_new_tokens: int,
                 eos_token_ids: Sequence[int], pad_token_id: int, do_sample: bool = True, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float = 1.0, row_keys: Sequence[Hashable] | None = None,
                 greedy_samples: int = 0, logprobs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Completion ids, (len(prompts) * num_samples, T), as `a2po.rollout.sample_completions` returns them:
        row i * num_samples + j is sample j of prompt i; after a row's first EOS it holds `pad_token_id`. The
        first `greedy_samples` samples of each prompt are greedy; without `row_keys` sampled rows are unseeded.

        With `logprobs`, also each sampled token's log-probability under the distribution it was drawn from
        (softmax(logits / temperature) after top-k/top-p; NaN where vLLM gives none), float32 of the same shape,
        0 after a row's end; else None."""
        from vllm import SamplingParams

        if self.asleep:  # the weights were pushed (and woken) by `load_weights`; the KV cache comes back now
            self._wake_up("kv_cache")
            self.asleep = False
        total = len(prompts) * num_samples
        if row_keys is not None and len(row_keys) != total:
            raise ValueError(f"row_keys has {len(row_keys)} keys for {total} sequences; give one per sequence.")
        requests, params = [], []
        for i, prompt in enumerate(prompts):
            for j in range(num_samples):
                greedy = not do_sample or j < greedy_samples
                key = None if greedy or row_keys is None else row_keys[i * num_samples + j]
                requests.append({"prompt_token_ids": list(prompt)})
                params.append(SamplingParams(
                    # The trainer's EOS tokens end a completion, and no other: without `ignore_eos` vLLM also
                    # stops at the EOS of the model config's class defaults (the written config has none).
                    n=1, max_tokens=max_new_tokens, stop_token_ids=list(eos_token_ids), ignore_eos=True,
                    detokenize=False, logprobs=0 if logprobs else None,  # 0: the sampled token's alone
                    temperature=0.0 if greedy else temperature, top_k=top_k or 0, top_p=top_p,
                    seed=None if key is None else stream_seed(key)))
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        if self.settings.enable_sleep_mode:  # the optimizer step that comes next gets the memory back
            self.sleep()
        rows = [list(output.outputs[0].token_ids) for output in outputs]
        width = max((len(row) for row in rows), default=0)
        out = torch.full((total, width), pad_token_id, dtype=torch.long)
        for r, row in enumerate(rows):
            out[r, :len(row)] = torch.tensor(row, dtype=torch.long)
        if not logprobs:
            return out, None
        logps = torch.zeros((total, width), dtype=torch.float32)
        for r, (output, row) in enumerate(zip(outputs, rows)):
            logps[r, :len(row)] = torch.tensor([position[token].logprob
                                                for position, token in zip(output.outputs[0].logprobs, row)])
        return out, logps


_NOT_SHAPE = {"_name_or_path", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache",
              "return_dict", "output_attentions", "output_hidden_states"}


def engine_settings(args, model_config, dtype: torch.dtype) -> EngineSettings:
    """The engine settings for a trainer's config (`use_vllm`, `vllm_*`) and its policy's model config.

    vLLM builds the model from a directory holding only the policy's `config.json` (keyed by its content, so
    equal models share a directory and an engine) with random weights (`load_format="dummy"`): the trainer pushes
    the weights it samples from before every use, so vLLM never reads a checkpoint, and any model the trainer holds
    (a hub id, a local directory, the GGUF default, an object built in code) is handled alike.
    """
    # The model's shapes only: the Trainer rewrites token ids and flags in the config as it trains, which must
    # neither change the directory nor start another engine.
    shape = {k: v for k, v in model_config.to_diff_dict().items() if k not in _NOT_SHAPE}
    text = json.dumps(shape, indent=2, sort_keys=True)
    folder = config_folder(text)
    arguments = engine_arguments(args)
    if arguments["max_model_len"] is None and args.max_prompt_length is not None and \
            args.max_completion_length is not None:
        arguments["max_model_len"] = args.max_prompt_length + args.max_completion_length
    return EngineSettings(model=str(folder), dtype=str(dtype).removeprefix("torch."),
                          options=tuple(sorted(arguments.items())), trust_remote_code=args.trust_remote_code)


def cache_root() -> Path:
    """Where this user's engine config folders live: `vllm` in the cache folder (`$A2PO_CACHE_DIR`, else
    `~/.cache/a2po`; `a2po.models.default_cache_dir`)."""
    from a2po.models import default_cache_dir

    return default_cache_dir() / "vllm"


def _private_folder(path: Path) -> Path:
    """`path` as a folder only this user can enter (created with mode 0700), or an error naming what is wrong with
    one found there: a link, another owner, or rights for others (anyone could have put files in it)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = os.lstat(path)
    problem = None
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        problem = "is not a plain folder (a link?)"
    elif found.st_uid != os.geteuid():
        problem = f"belongs to another user (uid {found.st_uid})"
    elif found.st_mode & 0o077:
        problem = f"can be entered or written by others (mode {stat.S_IMODE(found.st_mode):o})"
    if problem:
        raise PermissionError(f"vLLM's config folder {path} {problem}: vLLM reads it (with trust_remote_code, runs "
                              "its code). Remove it, or set A2PO_CACHE_DIR to a folder of your own.")
    return path


def config_folder(config_text: str) -> Path:
    """The folder vLLM builds the model from, holding `config_text` as its config.json: private to this user
    (`_private_folder`) and named by the text's hash, so equal models share a folder and an engine."""
    root = _private_folder(cache_root())
    folder = _private_folder(root / hashlib.sha256(config_text.encode()).hexdigest()[:16])
    target = folder / "config.json"
    if not target.is_file() or target.read_text() != config_text:
        partial = folder / f"config.json.{os.getpid()}"
        partial.write_text(config_text)
        partial.replace(target)  # atomic: another process never reads half a file
    return folder


_ENGINE: VLLMEngine | None = None


def engine_for(settings: EngineSettings) -> VLLMEngine:
    """The process's engine for `settings`: the live one when its settings are equal, else a new one."""
    global _ENGINE
    if _ENGINE is None or _ENGINE.settings != settings:
        if _ENGINE is not None:  # the old engine goes before the new one takes memory
            _ENGINE.shutdown()
        _ENGINE = None
        _ENGINE = VLLMEngine(settings)
    return _ENGINE


def release_engine(engine: VLLMEngine) -> bool:
    """After `train()`: shut a GPU engine down, so its memory (0.3 of the GPU by default) goes back to the user; the
    next sampling starts another. A CPU engine stays for the process's next trainer (vLLM does not free a CPU
    engine's memory reliably). Returns whether it was shut down."""
    global _ENGINE
    if getattr(engine, "device", "cpu") == "cpu":
        return False
    engine.shutdown()
    if _ENGINE is engine:
        _ENGINE = None
    return True


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`model`'s weights under transformers' names, as a plain model of its architecture would hold them.

    A `torch.compile`d model (`torch_compile=True`) gives its original module's names, without `_orig_mod.`. For a
    peft (LoRA) model, each adapted layer's weight is what peft's own merge gives (`merge_and_unload`): the base
    weight plus the active adapters' delta, DoRA's magnitude scaling included; a `modules_to_save` module gives its
    trained copy, or its original where adapters are disabled (the reference, `disable_adapter()`). The model is not
    changed (no `merge_adapter`). Tensors are detached, in the model's dtype; vLLM casts them to its own.
    """
    from peft import PeftModel

    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if not isinstance(model, PeftModel):
        for name, tensor in model.state_dict().items():
            yield name, tensor.detach()
        return
    base = model.get_base_model()
    merged, copies = _merged_lora_layers(base), _modules_to_save(base)
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        wrapper = next((prefix for prefix in copies if name.startswith(prefix + ".")), None)
        if wrapper is not None:  # `<wrapper>.original_module.<p>` or `<wrapper>.modules_to_save.<adapter>.<p>`
            tail = name[len(wrapper) + 1:]
            if not tail.startswith(copies[wrapper]):
                continue
            name = f"{wrapper}.{tail[len(copies[wrapper]):]}"
        if name in merged:
            tensor = merged[name]
        yield name.replace(".base_layer.", "."), tensor.detach()


def _merged_lora_layers(base: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The merged weight (and bias) of every LoRA layer with active adapters, by state-dict name, computed as peft's
    `merge(safe_merge=True)` computes it, on copies: plain LoRA adds `get_delta_weight`; a variant (DoRA) merges
    through its own `merge_safe`."""
    from peft.tuners.lora import LoraLayer

    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or module.disable_adapters or module.merged:
                continue
            adapters = [a for a in module.active_adapters if a in module.lora_A]
            if not adapters:
                continue
            layer = module.get_base_layer()
            weight, bias = layer.weight.detach().clone(), getattr(layer, "bias", None)
            for adapter in adapters:
                variant = getattr(module, "lora_variant", {}).get(adapter)
                if variant is not None:
                    weight = variant.merge_safe(module, adapter, weight)
                elif getattr(module, "use_dora", {}).get(adapter):
                    raise NotImplementedError(f"{name}: this peft version merges DoRA adapters without "
                                              "`lora_variant`; upgrade peft (>= 0.17), or set use_vllm=False.")
                else:
                    weight = weight + module.get_delta_weight(adapter).to(weight.dtype)
                if getattr(module, "lora_bias", {}).get(adapter) and bias is not None:
                    bias = bias + module.lora_B[adapter].bias * module.scaling[adapter]
            out[f"{name}.base_layer.weight"] = weight
            if bias is not None:
                out[f"{name}.base_layer.bias"] = bias.to(layer.bias.dtype)
    return out


def _modules_to_save(base: torch.nn.Module) -> dict[str, str]:
    """peft's `modules_to_save` wrappers, by module name: the state-dict infix of the module they compute with now,
    "modules_to_save.<adapter>." (the trained copy) or "original_module." (adapters disabled: the reference)."""
    from peft.utils.other import ModulesToSaveWrapper

    out = {}
    for name, module in base.named_modules():
        if isinstance(module, ModulesToSaveWrapper):
            active = [a for a in module.active_adapters if a in module.modules_to_save]
            trained = not module.disable_adapters and active
            out[name] = f"modules_to_save.{active[0]}." if trained else "original_module."
    return out
