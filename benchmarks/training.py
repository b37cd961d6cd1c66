"""One epoch of A*-PO, ours against TRL's `A2POTrainer` and `GRPOTrainer`: same model, prompts, reward, settings.

    python -m benchmarks.training --size small          # ours, ours-bf16, TRL A2PO, TRL GRPO: 3 interleaved repeats
    python -m benchmarks.training --size small --scaling    # ours only: wall time vs N, completion length, prompts
    python -m benchmarks.training --size q05 --out results.json --markdown results.md    # on a GPU (bf16)
    python -m benchmarks.training --size q05 --device cpu --bf16 --impl ours ours-bf16 trl-a2po --repeats 1 \
        --num-prompts 8 --prompt-words 16 --max-completion 8   # what each holds at the q05 shape, on the CPU

The set-up is the peers' benchmark one (docs/benchmarks.md): a random-init Qwen2 model (tiny / small on the CPU in fp32,
Qwen2.5-0.5B-shaped `q05` on a GPU, stored in bf16), a word-level tokenizer built in code, random prompts and a
deterministic binary reward (md5 of the completion text, ~40% ones); batch 8, 8 value samples / generations,
gradient checkpointing, one epoch. `ours` is the trainer at its default precision (fp32 master weights, computed in
bf16 under `bf16`), `ours-bf16` keeps the checkpoint's bf16 weights as TRL does. TRL's trainers are the optional
`bench` extra; they are skipped with a note when `trl` is not installed.

Each run is its own subprocess, so its peak memory is its own (peak RSS from `getrusage` on the CPU,
`torch.cuda.max_memory_allocated` on a GPU), and every implementation gets the same torch thread count. Runs are
interleaved (ours, ours-bf16, trl-a2po, trl-grpo, ours, ...) and medians are reported. What is timed and counted:

- `wall`: `trainer.train()`, end to end (for A*-PO: stage 1 + stage 2); `tokens_per_s`: completion tokens sampled in
  it (both stages) per second of it.
- `stage 1`: the value-estimation method, wrapped from outside (ours: `trainer.stage_one.estimate`, TRL:
  `_estimate_optimal_values`); `stage 2` is the rest of `train()`.
- decoding: ours reports `trainer.rollout_stats`; for TRL every `model.generate` call is timed (prefill included,
  as in ours). `ms/step` is the time per batched decode step, `tok/s` counts completion tokens up to the first EOS.
  With vLLM its engine start, its weight pushes and (on a GPU) the memory it holds are reported apart.
- `held`: what the trainer holds at its first optimizer step, per parameter: weights, gradients, optimizer state and
  the reference's copy (`held_bytes`).

CPU fairness: on 2 shared cores OpenMP threads spin-wait, so a competing process slows a run many times. Before each
run the bench waits until the machine is idle (CPU busy fraction from /proc/stat, measured over 2 s, below
`--max-busy`), and afterwards it records how much CPU *other* processes used during the run
(`foreign_cpu`, fraction of all cores); a run above `--max-foreign` is repeated (`--retries`).

This module imports only the standard library at the top: a TRL run is started from this file by path, so it never
imports the `a2po` package and its memory is not charged with ours.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

IMPLS = ("ours", "ours-bf16", "trl-a2po", "trl-grpo")
TRL_IMPLS = ("trl-a2po", "trl-grpo")
EOS_ID, PAD_ID = 1, 0
PHASES = ("values", "train")  # stage-1 rollouts, stage-2 (GRPO: all) rollouts
SCALING = {"num_value_samples": (2, 4, 8, 16), "max_completion_length": (16, 32, 64), "num_prompts": (16, 32, 64)}


@dataclass(frozen=True)
class Shape:
    """A model and workload size of the benchmark set-up."""

    vocab: int
    num_prompts: int
    prompt_words: int
    max_completion: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int


SIZES = {
    # 2 heads of 32: vLLM's CPU attention takes no smaller head (`gpu_check.sh --cpu` runs vLLM at this size).
    "tiny": Shape(512, 16, 16, 16, hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1),
    "small": Shape(8192, 32, 48, 48, hidden=256, intermediate=704, layers=4, heads=4, kv_heads=2),
    "q05": Shape(151936, 32, 96, 256, hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2),
}


@dataclass(frozen=True)
class Job:
    """One run: what `run_job` needs, passed to the subprocess as JSON."""

    impl: str
    size: str
    model_dir: str
    output_dir: str
    result_path: str
    device: str
    threads: int | None
    num_value_samples: int = 8
    max_completion_length: int | None = None  # None: the size's default
    num_prompts: int | None = None  # None: the size's default
    use_vllm: bool = False  # ours only: sample with a colocated vLLM engine (the config's `use_vllm`)
    vllm_enable_sleep_mode: bool = False
    bf16: bool | None = None  # bf16 autocast; None: on a GPU (the CPU runs compute in fp32 unless asked)
    prompt_words: int | None = None  # None: the size's default


# ----------------------------------------------------------------------------------------------------------------
# The workload (the peers' benchmark set-up, docs/benchmarks.md)


def make_prompts(size: str, count: int | None = None, words: int | None = None) -> list[str]:
    """Random word prompts (`words` each, default the size's); the first ones are the same whatever `count` is."""
    shape = SIZES[size]
    rng = random.Random(0)
    return [" ".join(f"t{rng.randrange(3, shape.vocab)}" for _ in range(words or shape.prompt_words))
            for _ in range(count or shape.num_prompts)]


def binary_reward(completions: Sequence[str], **kwargs: Any) -> list[float]:
    """Deterministic in the text, ~40% ones (the benchmark set-up's reward)."""
    return [float(int(hashlib.md5(c.encode()).hexdigest(), 16) % 10 < 4) for c in completions]


def make_tokenizer(size: str):
    """The benchmark set-up's word-level tokenizer ("t<id>" words), built in code.

    Built in each run rather than loaded: `AutoTokenizer` would pick the Qwen2 tokenizer class from the model type.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD_ID, "<eos>": EOS_ID, "<unk>": 2, **{f"t{i}": i for i in range(3, SIZES[size].vocab)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def build_model(size: str, directory: str | Path, dtype_name: str) -> str:
    """Save the benchmark set-up's random-init Qwen2 model (and its tokenizer) under `directory`; returns the path."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = SIZES[size]
    tokenizer = make_tokenizer(size)
    extra = ({"max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6} if size == "q05"
             else {})
    config = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, tie_word_embeddings=True, **extra)
    config.pad_token_id, config.eos_token_id, config.bos_token_id = PAD_ID, EOS_ID, EOS_ID
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype_name))
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    path = Path(directory) / f"model-{size}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# ----------------------------------------------------------------------------------------------------------------
# One run (inside its own subprocess)


def current_rss_gib() -> float:
    """Resident set size now (Linux /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return peak_rss_gib()


def peak_rss_gib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def _empty_phase() -> dict[str, float]:
    return {"seconds": 0.0, "decode_steps": 0.0, "sequences": 0.0, "tokens": 0.0, "calls": 0.0}


def _time_generate(stats: dict[str, dict[str, float]], phase: Callable[[], str]) -> Callable[[], None]:
    """Time every `model.generate` call (TRL's rollouts) into `stats[phase()]`; returns the undo function."""
    import torch
    from transformers import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, *args: Any, **kwargs: Any):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        if out.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        completion = out[:, input_ids.shape[1]:]
        is_eos = (completion == EOS_ID).int()
        tokens = int(((torch.cumsum(is_eos, dim=1) - is_eos) == 0).sum())  # up to and including the first EOS
        entry = stats.setdefault(phase(), _empty_phase())
        entry["seconds"] += seconds
        entry["decode_steps"] += completion.shape[1]
        entry["sequences"] += completion.shape[0]
        entry["tokens"] += tokens
        entry["calls"] += 1
        return out

    GenerationMixin.generate = generate

    def undo() -> None:
        GenerationMixin.generate = original

    return undo


def tensor_bytes(tensors: Any, seen: set[int]) -> int:
    """Bytes of the storages under `tensors` not already in `seen` (tied weights count once)."""
    total = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def held_bytes(model: Any, optimizer: Any, reference: Any) -> dict[str, Any]:
    """What a trainer holds for its model right after an optimizer step, in bytes and in bytes per parameter of the
    model: weights, gradients, optimizer state, the reference's copy (none with LoRA: the adapters switched off)."""
    import torch

    seen: set[int] = set()
    params = list(model.parameters())
    count = sum(p.numel() for p in {id(p): p for p in params}.values())
    parts = {"weights": tensor_bytes(params, seen),
             "grads": tensor_bytes([p.grad for p in params if p.grad is not None], seen),
             "optimizer": tensor_bytes([v for state in optimizer.state.values() for v in state.values()
                                        if isinstance(v, torch.Tensor) and v.dim() > 0], seen),
             "reference": tensor_bytes(list(reference.parameters()), seen) if reference is not None else 0}
    return {"params": count, "bytes": parts, "total_bytes": sum(parts.values()),
            "bytes_per_param": {k: v / count for k, v in parts.items()},
            "total_bytes_per_param": sum(parts.values()) / count,
            "dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in params if p.requires_grad})}


def held_bytes_callback() -> Any:
    """A callback that records `held_bytes` at the first optimizer step (`.summary`); set `.trainer` after building
    the trainer (the reference is the trainer's `ref_model`, ours and TRL's alike)."""
    from transformers import TrainerCallback

    class HeldBytes(TrainerCallback):
        trainer: Any = None
        summary: dict[str, Any] | None = None

        def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            if self.summary is None and self.trainer is not None:
                trainer = self.trainer
                self.summary = held_bytes(trainer.model, trainer.optimizer, getattr(trainer, "ref_model", None))

    return HeldBytes()


def run_job(job: Job) -> dict[str, Any]:
    """Train one epoch with `job.impl` and measure it. Runs in a fresh process (see `run_isolated`)."""
    started = time.perf_counter()
    import torch
    from datasets import Dataset

    if job.threads:
        torch.set_num_threads(job.threads)
    if job.impl in ("ours", "ours-bf16"):
        from a2po import A2POCallback, A2POConfig, A2POTrainer
    elif job.impl == "trl-a2po":
        from trl.experimental.a2po import A2POConfig, A2POTrainer
    elif job.impl == "trl-grpo":
        from trl import GRPOConfig, GRPOTrainer
    else:
        raise ValueError(f"unknown implementation {job.impl!r}; choose from {IMPLS}")
    if job.use_vllm and job.impl not in ("ours", "ours-bf16"):
        raise ValueError(f"use_vllm is measured for ours only (got impl {job.impl!r}); TRL's trainers here use "
                         "transformers' generate")
    rss_after_import = current_rss_gib()
    import_s = time.perf_counter() - started

    shape = SIZES[job.size]
    cuda = job.device == "cuda"
    bf16 = cuda if job.bf16 is None else job.bf16
    max_completion = job.max_completion_length or shape.max_completion
    tokenizer = make_tokenizer(job.size)
    dataset = Dataset.from_dict({"prompt": make_prompts(job.size, job.num_prompts, job.prompt_words)})
    # Ours at the default precision loads no dtype (fp32 master weights, computed in bf16 under `bf16`); "ours-bf16"
    # and TRL keep the checkpoint's bf16 weights, as TRL does by default (fp32 on the CPU without `bf16`).
    weights = {"model_init_kwargs": {"dtype": torch.bfloat16 if bf16 else torch.float32}}
    common = dict(output_dir=job.output_dir, per_device_train_batch_size=8, num_train_epochs=1, logging_steps=1,
                  report_to="none", save_strategy="no", bf16=bf16, use_cpu=not cuda,
                  max_completion_length=max_completion, learning_rate=1e-6, gradient_checkpointing=True, seed=0,
                  disable_tqdm=True, **({} if job.impl == "ours" else weights))

    stats: dict[str, dict[str, float]] = {}
    stage1: dict[str, Any] = {"seconds": 0.0, "running": False, "peak_rss_gib": None}
    values_runtime: list[float] = []

    def timed_stage1(method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stage1["running"] = True
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if cuda:
                    torch.cuda.synchronize()
                stage1["seconds"] += time.perf_counter() - start
                stage1["running"] = False
                stage1["peak_rss_gib"] = peak_rss_gib()
        return wrapper

    undo = None
    engine_memory = {"bytes": 0}
    held = held_bytes_callback()
    if job.impl in ("ours", "ours-bf16"):
        class RecordRuntime(A2POCallback):
            def on_values_end(self, args, state, control, *, split, values, summary, **kwargs):
                values_runtime.append(float(summary.get("runtime", float("nan"))))

        if job.use_vllm and cuda:  # what vLLM holds (weights and its KV pool), apart from the trainer's own
            from a2po.vllm_engine import VLLMEngine

            start_engine = VLLMEngine._start

            def measured_start(settings: Any) -> Any:
                before = torch.cuda.memory_allocated()
                try:
                    return start_engine(settings)
                finally:
                    engine_memory["bytes"] += torch.cuda.memory_allocated() - before

            VLLMEngine._start = staticmethod(measured_start)
        args = A2POConfig(num_value_samples=job.num_value_samples, beta1=0.5, beta2=1e-3, max_prompt_length=512,
                          use_vllm=job.use_vllm, vllm_enable_sleep_mode=job.vllm_enable_sleep_mode, **common)
        trainer = A2POTrainer(model=job.model_dir, reward_funcs=binary_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[RecordRuntime(), held])
        trainer.stage_one.estimate = timed_stage1(trainer.stage_one.estimate)
    elif job.impl == "trl-a2po":
        args = A2POConfig(num_value_samples=job.num_value_samples, beta1=0.5, beta2=1e-3, max_prompt_length=512,
                          **common)
        trainer = A2POTrainer(model=job.model_dir, reward_funcs=binary_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[held])
        trainer._estimate_optimal_values = timed_stage1(trainer._estimate_optimal_values)
        undo = _time_generate(stats, lambda: "values" if stage1["running"] else "train")
    else:
        args = GRPOConfig(num_generations=8, gradient_accumulation_steps=8, beta=0.001, **common)
        trainer = GRPOTrainer(model=job.model_dir, reward_funcs=binary_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[held])
        undo = _time_generate(stats, lambda: "train")
    held.trainer = trainer
    rss_after_init = current_rss_gib()
    peak_rss_before_train = peak_rss_gib()

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    output = trainer.train()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if undo is not None:
        undo()

    engine_start_s = push_s = None
    if job.impl in ("ours", "ours-bf16"):
        stats = {phase: {**_empty_phase(), **dict(values)} for phase, values in trainer.rollout_stats.items()}
        # The trainer times vLLM's start and its weight pushes apart from sampling (`seconds`).
        engine_start_s = sum(v.pop("engine_start_seconds", 0.0) for v in stats.values())
        push_s = sum(v.pop("weight_push_seconds", 0.0) for v in stats.values())
    phases = {}
    for phase in PHASES:
        entry = stats.get(phase)
        if not entry or not entry["decode_steps"]:
            continue
        phases[phase] = {**entry, "ms_per_step": 1000 * entry["seconds"] / entry["decode_steps"],
                         "tokens_per_s": entry["tokens"] / entry["seconds"] if entry["seconds"] else 0.0}
    has_stage1 = job.impl != "trl-grpo"
    vllm = None
    if job.use_vllm:
        import vllm as vllm_package
        from vllm.platforms import current_platform

        vllm = {"version": vllm_package.__version__, "device": current_platform.device_name,
                "sleep_mode_available": current_platform.is_sleep_mode_available()}
    peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    tokens = sum(entry["tokens"] for entry in phases.values())
    return {
        "impl": job.impl, "size": job.size, "device": job.device, "bf16": bf16,
        "engine_start_s": engine_start_s if job.use_vllm else None, "vllm": vllm,
        "weight_push_s": push_s if job.use_vllm else None,
        "engine_gpu_gib": engine_memory["bytes"] / 2**30 if job.use_vllm and cuda else None,
        "trainer_peak_gpu_gib": peak_gpu - engine_memory["bytes"] / 2**30 if job.use_vllm and cuda else None,
        "held": held.summary, "tokens_per_s": tokens / wall if wall else None,
        "wall_s": wall,
        "stage1_s": stage1["seconds"] if has_stage1 else None,
        "stage2_s": wall - stage1["seconds"] if has_stage1 else None,
        "values_runtime_s": values_runtime[0] if values_runtime else None,
        "phases": phases,
        "peak_rss_gib": peak_rss_gib(),
        "peak_gpu_gib": peak_gpu,
        "rss_after_import_gib": rss_after_import, "rss_after_init_gib": rss_after_init,
        "peak_rss_before_train_gib": peak_rss_before_train, "peak_rss_after_stage1_gib": stage1["peak_rss_gib"],
        "import_s": import_s, "steps": output.global_step, "threads": torch.get_num_threads(),
        "num_prompts": len(dataset), "max_completion_length": max_completion,
        "num_value_samples": job.num_value_samples if has_stage1 else None,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else None,
        "param_bytes": sum(p.numel() * p.element_size() for p in trainer.model.parameters()),
    }


def _child_main(job_json: str) -> None:
    job = Job(**json.loads(job_json))
    result = run_job(job)
    Path(job.result_path).write_text(json.dumps(result))


# Started as `python -c _CHILD_BOOT <this file> <job json>`: loads this file by path, not the `a2po` package.
_CHILD_BOOT = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('a2po_bench_child', "
               "sys.argv[1]); module = sys.modules['a2po_bench_child'] = importlib.util.module_from_spec(spec); "
               "spec.loader.exec_module(module); module._child_main(sys.argv[2])")


# ----------------------------------------------------------------------------------------------------------------
# Running runs fairly (parent process)


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs since boot, from /proc/stat; None where unavailable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def cpu_busy(interval: float = 2.0) -> float | None:
    """Fraction of all CPUs busy over `interval` seconds (0..1); None where /proc/stat is missing."""
    before = _cpu_jiffies()
    time.sleep(interval)
    after = _cpu_jiffies()
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def wait_until_idle(max_busy: float, timeout: float, log: Callable[[str], None]) -> float | None:
    """Wait (up to `timeout` s) until other processes use at most `max_busy` of the CPUs; returns the last reading."""
    deadline = time.monotonic() + timeout
    busy = cpu_busy()
    warned = False
    while busy is not None and busy > max_busy and time.monotonic() < deadline:
        if not warned:
            log(f"  machine busy ({busy:.0%} of CPUs, load {load_average():.2f}); waiting for it to go idle ...")
            warned = True
        time.sleep(5)
        busy = cpu_busy()
    if busy is not None and busy > max_busy:
        log(f"  still busy ({busy:.0%}) after {timeout:.0f} s: measuring anyway (see foreign_cpu in the results)")
    return busy


def run_isolated(job: Job, *, max_busy: float, wait: float, max_foreign: float, retries: int,
                 log: Callable[[str], None], python: str | None = None) -> dict[str, Any]:
    """Run `job` in a fresh Python process (`python`, default this one) once the machine is idle; repeat it if
    others competed for the CPUs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    if job.threads:
        env.update(OMP_NUM_THREADS=str(job.threads), MKL_NUM_THREADS=str(job.threads))
    cpus = os.cpu_count() or 1
    for attempt in range(retries + 1):
        # A fresh output directory: ours would otherwise reuse the V* table an earlier attempt saved there.
        shutil.rmtree(job.output_dir, ignore_errors=True)
        busy_before = wait_until_idle(max_busy, wait, log) if wait > 0 else cpu_busy(0.5)
        load = load_average()
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        jiffies_before = _cpu_jiffies()
        start = time.perf_counter()
        log_path = Path(job.result_path).with_suffix(".log")
        with open(log_path, "w") as log_file:
            code = subprocess.call([python or sys.executable, "-c", _CHILD_BOOT, __file__, json.dumps(asdict(job))],
                                   stdout=log_file, stderr=subprocess.STDOUT, env=env)
        elapsed = time.perf_counter() - start
        if code != 0:
            tail = log_path.read_text()[-4000:]
            raise RuntimeError(f"{job.impl} run failed (exit {code}); last lines of its output:\n{tail}")
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        jiffies_after = _cpu_jiffies()
        shutil.rmtree(job.output_dir, ignore_errors=True)
        result = json.loads(Path(job.result_path).read_text())
        child_cpu = ((children_after.ru_utime + children_after.ru_stime)
                     - (children_before.ru_utime + children_before.ru_stime))
        foreign = None
        if jiffies_before is not None and jiffies_after is not None:
            all_busy = (jiffies_after[0] - jiffies_before[0]) / os.sysconf("SC_CLK_TCK")
            foreign = max(0.0, all_busy - child_cpu) / (elapsed * cpus)
        result.update(load_average=load, busy_before=busy_before, foreign_cpu=foreign, attempt=attempt + 1,
                      process_s=elapsed)
        if foreign is None or foreign <= max_foreign or attempt == retries:
            return result
        log(f"  other processes used {foreign:.0%} of the CPUs during the run: repeating it")
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------------------------
# Summaries and tables


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats of one implementation (or one scaling point)."""
    keys = ("wall_s", "stage1_s", "stage2_s", "values_runtime_s", "peak_rss_gib", "peak_gpu_gib",
            "rss_after_import_gib", "rss_after_init_gib", "load_average", "foreign_cpu", "tokens_per_s")
    out: dict[str, Any] = {key: _median([run.get(key) for run in runs]) for key in keys}
    out["repeats"] = len(runs)
    out["held"] = runs[0].get("held")  # the same dtypes and shapes in every repeat
    out["phases"] = {}
    for phase in PHASES:
        entries = [run["phases"][phase] for run in runs if phase in run.get("phases", {})]
        if entries:
            out["phases"][phase] = {key: _median([e[key] for e in entries]) for key in entries[0]}
    out["peak_memory_gib"] = out["peak_gpu_gib"] if out["peak_gpu_gib"] is not None else out["peak_rss_gib"]
    return out


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """ours / peer for wall time, stage 1 and peak memory (below 1: ours is faster / smaller)."""
    ours = summary.get("ours")
    out = {}
    for impl, peer in summary.items():
        if impl == "ours" or ours is None:
            continue
        out[impl] = {key: (ours[key] / peer[key] if ours.get(key) is not None and peer.get(key) else None)
                     for key in ("wall_s", "stage1_s", "stage2_s", "peak_memory_gib")}
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in rows]
    return "\n".join(lines)


def comparison_table(summary: dict[str, dict[str, Any]], markdown: bool = False) -> str:
    memory = "peak GPU GiB" if any(s.get("peak_gpu_gib") is not None for s in summary.values()) else "peak RSS GiB"
    headers = ["implementation", "epoch s", "stage 1 s", "stage 2 s", "S1 decode ms/step", "S1 tok/s",
               "S2 decode ms/step", "S2 tok/s", "epoch tok/s", "held B/param", memory, "ours/this wall",
               "ours/this memory"]
    rel = ratios(summary)
    rows = []
    for impl, s in summary.items():
        stage1, stage2 = s["phases"].get("values", {}), s["phases"].get("train", {})
        r = rel.get(impl, {})
        rows.append([impl, _fmt(s["wall_s"]), _fmt(s["stage1_s"]), _fmt(s["stage2_s"]),
                     _fmt(stage1.get("ms_per_step"), 1), _fmt(stage1.get("tokens_per_s"), 0),
                     _fmt(stage2.get("ms_per_step"), 1), _fmt(stage2.get("tokens_per_s"), 0),
                     _fmt(s.get("tokens_per_s"), 0), _fmt((s.get("held") or {}).get("total_bytes_per_param"), 1),
                     _fmt(s["peak_memory_gib"], 3), _fmt(r.get("wall_s")), _fmt(r.get("peak_memory_gib"))])
    return format_table(headers, rows, markdown)


def scaling_table(points: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    headers = ["varied", "value", "epoch s", "stage 1 s", "stage 2 s", "S1 decode ms/step", "S1 tok/s",
               "S2 tok/s", "epoch / smallest", "peak RSS GiB"]
    rows = []
    for point in points:
        s = point["summary"]
        stage1, stage2 = s["phases"].get("values", {}), s["phases"].get("train", {})
        rows.append([point["factor"], str(point["value"]), _fmt(s["wall_s"]), _fmt(s["stage1_s"]),
                     _fmt(s["stage2_s"]), _fmt(stage1.get("ms_per_step"), 1), _fmt(stage1.get("tokens_per_s"), 0),
                     _fmt(stage2.get("tokens_per_s"), 0), _fmt(point.get("relative")),
                     _fmt(s["peak_memory_gib"], 3)])
    return format_table(headers, rows, markdown)


# ----------------------------------------------------------------------------------------------------------------
# Command line


def machine_info(device: str, threads: int | None) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": os.cpu_count(), "threads": threads, "device": device}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    for package in ("torch", "transformers", "trl", "datasets"):
        try:
            from importlib.metadata import version

            info[package] = version(package)
        except Exception:
            info[package] = None
    return info


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="Model and workload size (default: q05 with a GPU, else small).")
    parser.add_argument("--impl", nargs="+", choices=IMPLS, default=list(IMPLS), help="Implementations to run.")
    parser.add_argument("--scaling", action="store_true",
                        help="Ours only: wall time vs num_value_samples, max_completion_length and num_prompts.")
    parser.add_argument("--repeats", type=int, default=3, help="Interleaved runs per implementation (medians).")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="Prompts in the epoch (default: the size's; 8 a step).")
    parser.add_argument("--max-completion", type=int, default=None,
                        help="Completion tokens (default: the size's); a short one measures held memory on the CPU.")
    parser.add_argument("--prompt-words", type=int, default=None, help="Prompt tokens (default: the size's).")
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 autocast on the CPU too, as on a GPU (slow: for memory figures).")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda for q05 (bf16), cpu (fp32) for tiny and small.")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch / OpenMP threads for every run on the CPU (default: all CPUs available).")
    parser.add_argument("--max-busy", type=float, default=0.1,
                        help="Start a run only when at most this fraction of the CPUs is busy.")
    parser.add_argument("--wait", type=float, default=900.0,
                        help="Seconds to wait for an idle machine before each run (0: do not wait).")
    parser.add_argument("--max-foreign", type=float, default=0.1,
                        help="Repeat a run when other processes used more than this fraction of the CPUs meanwhile.")
    parser.add_argument("--retries", type=int, default=2, help="Repeats of a disturbed run at most.")
    parser.add_argument("--out", help="Write every run and the medians as JSON here.")
    parser.add_argument("--markdown", nargs="?", const="-", default=None,
                        help="Print the tables as markdown (or write them to the given file).")
    parser.add_argument("--workdir", help="Where models and run outputs go (default: a temporary directory).")
    parser.add_argument("--bandwidth", type=float, default=4.3,
                        help="GPU memory bandwidth in TB/s for the decode floor (reading all weights once per step; "
                             "the default is an H200's).")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    cuda_available = _cuda_available()
    size = args.size or ("q05" if cuda_available else "small")
    device = args.device if args.device != "auto" else ("cuda" if size == "q05" else "cpu")
    if device == "cuda" and not cuda_available:
        raise SystemExit(f"--size {size} runs on a GPU (bf16) and none is available; use --size small on the CPU "
                         "or --device cpu.")
    threads = args.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    notes: list[str] = []
    impls = ["ours"] if args.scaling else list(dict.fromkeys(args.impl))
    if importlib.util.find_spec("trl") is None:
        skipped = [impl for impl in impls if impl in TRL_IMPLS]
        if skipped:
            notes.append(f"skipped {', '.join(skipped)}: trl is not installed (pip install 'a2po-studio[bench]')")
            impls = [impl for impl in impls if impl not in TRL_IMPLS]
    for note in notes:
        log(f"note: {note}")
    if not impls:
        raise SystemExit("nothing to run: " + "; ".join(notes))

    workdir_context = tempfile.TemporaryDirectory(prefix="a2po-bench-") if args.workdir is None else None
    workdir = Path(args.workdir or workdir_context.name)
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine_info(device, threads), "size": size, "notes": notes,
                              "settings": {"repeats": args.repeats, "max_busy": args.max_busy,
                                           "max_foreign": args.max_foreign, "bandwidth_tbs": args.bandwidth}}
    try:
        log(f"building the {size} model (load average {load_average():.2f}) ...")
        model_dir = build_model(size, workdir, "bfloat16" if device == "cuda" or args.bf16 else "float32")
        counter = iter(range(10**6))
        completed: list[dict[str, Any]] = []

        def job(impl: str, **overrides: Any) -> Job:
            index = next(counter)
            return Job(impl=impl, size=size, model_dir=model_dir, output_dir=str(workdir / f"run{index}"),
                       result_path=str(workdir / f"run{index}.json"), device=device,
                       threads=threads if device == "cpu" else args.threads,
                       **{"num_prompts": args.num_prompts, "max_completion_length": args.max_completion,
                          "prompt_words": args.prompt_words, "bf16": True if args.bf16 else None, **overrides})

        def measure(j: Job, label: str) -> dict[str, Any]:
            log(f"{label}: {j.impl} ...")
            result = run_isolated(j, max_busy=args.max_busy, wait=args.wait, max_foreign=args.max_foreign,
                                  retries=args.retries, log=log)
            foreign = result["foreign_cpu"]
            log(f"  {result['wall_s']:.2f} s, peak RSS {result['peak_rss_gib']:.3f} GiB, load "
                f"{result['load_average']:.2f}, others used {'?' if foreign is None else f'{foreign:.0%}'} of CPUs")
            completed.append({"label": label, "job": asdict(j), **result})
            if args.out:  # keep what is measured so far, should the benchmark be interrupted
                Path(args.out).write_text(json.dumps({**report, "partial": True, "completed": completed}, indent=1))
            return result

        if args.scaling:
            report["scaling"] = run_scaling(size, job, measure, args.repeats)
        else:
            runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in impls}
            for repeat in range(args.repeats):
                for impl in impls:
                    runs[impl].append(measure(job(impl), f"repeat {repeat + 1}/{args.repeats}"))
            report["runs"] = runs
            report["summary"] = {impl: summarize_runs(r) for impl, r in runs.items()}
            report["ratios"] = ratios(report["summary"])
    finally:
        if workdir_context is not None:
            workdir_context.cleanup()

    print_report(report, args.markdown)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        log(f"wrote {args.out}")
    return report


def run_scaling(size: str, job: Callable[..., Job], measure: Callable[[Job, str], dict[str, Any]],
                repeats: int) -> list[dict[str, Any]]:
    """Ours at the base settings and with one factor varied at a time; repeats interleaved over the points."""
    shape = SIZES[size]
    base = {"num_value_samples": 8, "max_completion_length": shape.max_completion, "num_prompts": shape.num_prompts}
    points = [{"factor": factor, "value": value, "settings": {**base, factor: value}}
              for factor, values in SCALING.items() for value in values]
    for point in points:
        point["runs"] = []
    for repeat in range(repeats):
        for point in points:
            label = f"repeat {repeat + 1}/{repeats}, {point['factor']}={point['value']}"
            point["runs"].append(measure(job("ours", **point["settings"]), label))
    for point in points:
        point["summary"] = summarize_runs(point["runs"])
    for point in points:  # growth: relative to the smallest value of the same factor
        first = next(p for p in points if p["factor"] == point["factor"])
        point["relative"] = point["summary"]["wall_s"] / first["summary"]["wall_s"]
    return points


def decode_floor_note(report: dict[str, Any]) -> str:
    """How far each decode is from the bandwidth floor: every weight read once per decode step."""
    bandwidth = report["settings"]["bandwidth_tbs"]
    runs = next(iter(report["runs"].values()))
    floor_ms = runs[0]["param_bytes"] / (bandwidth * 1e12) * 1e3
    parts = []
    for impl, s in report["summary"].items():
        for phase, name in (("values", "stage 1"), ("train", "stage 2")):
            ms = s["phases"].get(phase, {}).get("ms_per_step")
            if ms:
                parts.append(f"{impl} {name} {ms / floor_ms:.0f}x")
    return (f"decode floor (all weights read once per step at {bandwidth} TB/s): {floor_ms:.3f} ms/step; "
            f"decode time / floor: {', '.join(parts)}")


def print_report(report: dict[str, Any], markdown: str | None) -> None:
    as_markdown = markdown is not None
    machine = report["machine"]
    loads = [run["load_average"] for runs in report.get("runs", {}).values() for run in runs]
    loads += [run["load_average"] for point in report.get("scaling", []) for run in point["runs"]]
    foreign = [run["foreign_cpu"] for runs in report.get("runs", {}).values() for run in runs]
    foreign += [run["foreign_cpu"] for point in report.get("scaling", []) for run in point["runs"]]
    foreign = [f for f in foreign if f is not None]
    header = (f"size {report['size']}, device {machine['device']}, {machine['cpus']} CPUs, {machine['threads']} "
              f"threads, torch {machine['torch']}, transformers {machine['transformers']}, trl {machine['trl']}; "
              f"medians of {report['settings']['repeats']} interleaved runs; load average at the runs' start "
              f"{min(loads, default=float('nan')):.2f}-{max(loads, default=float('nan')):.2f}, other processes' "
              f"CPU share during runs <= {max(foreign, default=0.0):.0%}")
    parts = [header]
    if "summary" in report:
        parts.append(comparison_table(report["summary"], as_markdown))
    if "scaling" in report:
        parts.append(scaling_table(report["scaling"], as_markdown))
    if "summary" in report and machine["device"] == "cuda":
        parts.append(decode_floor_note(report))
    parts += [f"note: {note}" for note in report["notes"]]
    text = "\n\n".join(parts)
    if markdown not in (None, "-"):
        Path(markdown).write_text(text + "\n")
    print(text)


def _cuda_available() -> bool:
    """Whether a GPU is usable (asking does not create a CUDA context in this process)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()

if __name__ == "__main__":
    main()
