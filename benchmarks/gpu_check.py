"""The GPU check's steps (issues 30 and 46), one subcommand each; `scripts/gpu_check.sh` runs them in order.

    python -m benchmarks.gpu_check STEP --out DIR [--workdir DIR] [--timeout S] [--cpu]
    python -m benchmarks.gpu_check plan [--cpu] [STEP | core | more | all ...]

On a GPU one call runs one set (`SETS`), each step under a share of the call's budget (`SHARES`, `BUDGETS`), so that
one call fits 6 minutes of the lent machine and a full rerun fits its 15 (`GPU_CALL_LIMIT_S`; a test checks the
shares). `core`, the default, is what users get:

1. `training`: `python -m benchmarks.training` once at q05, 16 prompts: ours at the default precision (fp32 master
   weights, bf16 autocast), ours with bf16 weights, TRL's A2POTrainer and GRPOTrainer when `trl` imports
   (`trl_measured` says which were): epoch time, peak memory, tokens per second, bytes held per parameter; the
   verdict against TRL A2PO for the default.
2. `learning` (`benchmarks.learning`): a small transformer built and taught 2-digit sums by supervised steps, then
   A*-PO and GRPO on other sums: held-out accuracy before and after, loss, reward and log-ratio histories, CUDA's
   allocator figures.

`more`, a later call's: `decode` (the rollout engine's ms per decode step against the bandwidth floor), `lora` (ours
with LoRA, peak memory against TRL A2PO's), `studio` (one studio job through `app.runtime.worker` and SQLite),
`methods` (ours A*-PO against ours GRPO under the paper's protocol), `engines` (the samplers side by side, and one
step from a bf16 checkpoint; docs/benchmarks.md, "The engines side by side (CPU)").

Each step writes `DIR/<step>.json` as it goes (a step cut by its limit keeps what it measured) and one summary line
to stdout (everything else goes to stderr). `--cpu` (or no GPU) runs every step at a tiny size on the CPU, which
`tests/a2po/test_gpu_check.py` does so the check cannot rot. `failed STEP --rc N` is what the script calls after a
step that failed or ran out of time: it keeps what the step wrote, marks it failed and prints its line.

Only the standard library is imported at the top, so that `plan` and `failed` answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORE = ("training", "learning")
MORE = ("decode", "lora", "studio", "methods", "engines")
STEPS = (*CORE, *MORE)
# A call's sets: on the GPU the core (the default), or the rest in a later lease; on the CPU everything at once.
SETS = {"gpu": {"core": CORE, "more": MORE}, "cpu": {"all": STEPS}}
# One call on the lent GPU: 6 minutes of its 15, which also pay the machine's start and a full rerun. The steps share
# BUDGETS["gpu"] seconds; `timeout` kills a step at most KILL_GRACE_S after its limit.
GPU_CALL_LIMIT_S = 360
KILL_GRACE_S = 10
BUDGETS = {"gpu": 340, "cpu": 300}
# Each step's limit in percent of the budget; within a set they add up to at most 100 (the rest: the script's own
# seconds). A busy CPU slows the --cpu steps several times over: the test gives them a larger budget.
SHARES = {"gpu": {"training": 57, "learning": 38, "decode": 8, "lora": 15, "studio": 22, "methods": 32, "engines": 18},
          "cpu": {"training": 18, "learning": 14, "decode": 5, "lora": 8, "studio": 12, "methods": 12, "engines": 26}}
# The training step's work on the GPU: q05's shape with half its prompts (two optimizer steps), so that four epochs
# fit the step's share; the ratios between the implementations are what the step reports.
GPU_TRAINING_PROMPTS = 16
# The targets, against the anchors measured on an H200 (docs/benchmarks.md, "GPU").
TARGETS = {"wall_vs_trl_a2po": 0.2, "wall_vs_trl_grpo": 0.5, "memory_vs_trl_a2po": 0.8, "lora_vs_trl_a2po": 0.5,
           "decode_vs_floor": 10.0}
# SmolLM2-135M's architecture (its config.json), for the studio job; random weights, since the real ones do not fit
# in what travels to a GPU machine.
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=True)


class TimeUp(Exception):
    """The script's time limit for the step ran out (`timeout` sent SIGTERM): record what was measured so far."""


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a step killed by its time limit must not leave half a file."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n:.2f} GiB"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def torch_threads() -> int:
    """The CPU runs' thread count: OMP_NUM_THREADS, as gpu_check.sh --cpu sets it (1 by default)."""
    return int(os.environ.get("OMP_NUM_THREADS") or 1)


# ----------------------------------------------------------------------------------------------------------------
# What every step shares: the device, the sizes, the model, one measured training run


class Setting:
    """Where a step runs and at which size: the issue's on a GPU, tiny on the CPU."""

    def __init__(self, cpu: bool, workdir: Path):
        import torch

        self.cuda = torch.cuda.is_available() and not cpu
        self.device = "cuda" if self.cuda else "cpu"
        self.size = "q05" if self.cuda else "tiny"  # benchmarks.training's sizes
        self.dtype_name = "bfloat16" if self.cuda else "float32"
        self.workdir = workdir
        if not self.cuda:
            torch.set_num_threads(torch_threads())

    def info(self) -> dict[str, Any]:
        import torch

        from benchmarks.training import machine_info

        info = machine_info(self.device, torch.get_num_threads())
        info.update(size=self.size, dtype=self.dtype_name, cuda=torch.version.cuda,
                    gpu=torch.cuda.get_device_name() if self.cuda else None)
        return info

    def model_dir(self) -> str:
        """benchmarks.training's random-init model (step 1's when it built one in the same workdir)."""
        from benchmarks.training import build_model

        path = self.workdir / f"model-{self.size}"
        if not (path / "tokenizer.json").is_file():  # written last by build_model: a model cut short is rebuilt
            build_model(self.size, self.workdir, self.dtype_name)
        return str(path)

    def reset_peak(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_gib(self) -> float:
        """The CUDA allocator's peak since `reset_peak` on a GPU, the process's peak RSS on the CPU."""
        import torch

        from benchmarks.training import peak_rss_gib

        return torch.cuda.max_memory_allocated() / 2**30 if self.cuda else peak_rss_gib()

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()


def train_run(setting: Setting, method: str, *, lora: bool = False, filter_all_incorrect: bool = True
              ) -> dict[str, Any]:
    """One epoch of ours (`method` "a2po" or "grpo") on benchmarks.training's work and settings, measured, at the
    trainers' default precision (fp32 master weights, bf16 autocast on a GPU)."""
    from datasets import Dataset

    from a2po import A2POConfig, A2POTrainer, GRPOConfig, GRPOTrainer
    from benchmarks.training import SIZES, binary_reward, make_prompts, make_tokenizer

    shape = SIZES[setting.size]
    dataset = Dataset.from_dict({"prompt": make_prompts(setting.size)})
    common = dict(output_dir=str(setting.workdir / f"run-{method}{'-lora' if lora else ''}"),
                  per_device_train_batch_size=8, num_train_epochs=1, logging_steps=1, report_to="none",
                  save_strategy="no", bf16=setting.cuda, use_cpu=not setting.cuda,
                  max_completion_length=shape.max_completion, learning_rate=1e-6, gradient_checkpointing=True,
                  seed=0, disable_tqdm=True)
    peft_config = None
    if lora:
        from peft import LoraConfig

        # What a studio run's `"peft": {}` builds (a2po.runspec.RunSpec.peft_config).
        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    if method == "a2po":
        args = A2POConfig(num_value_samples=8, beta1=0.5, beta2=1e-3, max_prompt_length=512,
                          filter_all_incorrect=filter_all_incorrect, save_values=False, **common)
        trainer_class = A2POTrainer
    else:
        # benchmarks.training's GRPO settings: G = 8, the same 8 prompts per optimizer step as A*-PO.
        args = GRPOConfig(num_generations=8, gradient_accumulation_steps=8, beta=0.001, **common)
        trainer_class = GRPOTrainer
    trainer = trainer_class(model=setting.model_dir(), reward_funcs=binary_reward, args=args, train_dataset=dataset,
                            processing_class=make_tokenizer(setting.size), peft_config=peft_config)
    stage1 = {"seconds": 0.0}
    if method == "a2po":
        estimate = trainer.stage_one.estimate

        def timed(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return estimate(*a, **k)
            finally:
                setting.sync()
                stage1["seconds"] += time.perf_counter() - start

        trainer.stage_one.estimate = timed

    setting.reset_peak()
    start = time.perf_counter()
    output = trainer.train()
    setting.sync()
    wall = time.perf_counter() - start
    steps = output.global_step
    stage2 = wall - stage1["seconds"]
    phases = {phase: dict(values) for phase, values in trainer.rollout_stats.items()}
    train = phases.get("train", {})
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {"method": method, "lora": lora, "filter_all_incorrect": filter_all_incorrect if method == "a2po" else None,
            "epoch_s": wall, "stage1_s": stage1["seconds"] if method == "a2po" else None, "stage2_s": stage2,
            "steps": steps, "s_per_step": stage2 / steps if steps else None,
            "completions_per_step": train.get("sequences", 0.0) / steps if steps else None,
            "tokens_per_step": train.get("tokens", 0.0) / steps if steps else None,
            "stage1_tokens": phases.get("values", {}).get("tokens"),
            "decode_ms_per_step": {p: 1000 * v["seconds"] / v["decode_steps"] for p, v in phases.items()
                                   if v.get("decode_steps")},
            "peak_memory_gib": setting.peak_memory_gib(), "trainable_params": trainable, "rollout_stats": phases}


def run_child(args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    """`python -m benchmarks.gpu_check run ...` in a fresh process: its peak memory is its own."""
    with tempfile.NamedTemporaryFile(suffix=".json", dir=args.workdir, delete=False) as f:
        result_path = f.name
    command = [sys.executable, "-m", "benchmarks.gpu_check", "run", "--out", result_path, "--workdir",
               str(args.workdir), *(["--cpu"] if args.cpu else []), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    code = subprocess.call(command, cwd=ROOT, env=env, stdout=sys.stderr)
    if code != 0:
        raise RuntimeError(f"{' '.join(extra)}: the run failed (exit {code}); its traceback is above in the log")
    return json.loads(Path(result_path).read_text())


# ----------------------------------------------------------------------------------------------------------------
# 1. ours against TRL


def step_training(args: argparse.Namespace, setting: Setting) -> tuple[dict[str, Any], str]:
    from benchmarks import training

    # benchmarks.training writes its report here after every run: a step cut short leaves the runs it finished.
    partial = Path(args.out) / "training.json"
    argv = ["--size", setting.size, "--device", setting.device, "--repeats", "1", "--wait", "0", "--retries", "0",
            "--workdir", str(setting.workdir), "--out", str(partial),
            # The verdict's pair first: the default against TRL A2PO.
            "--impl", "ours", "trl-a2po", "ours-bf16", "trl-grpo"]
    if setting.cuda:
        argv += ["--num-prompts", str(GPU_TRAINING_PROMPTS)]
    else:
        argv += ["--threads", str(torch_threads())]
    result: dict[str, Any] = {"argv": argv}
    try:
        report = training.main(argv)
    except (Exception, SystemExit) as error:  # a failed TRL run must not lose ours: keep the runs before it
        report = json.loads(partial.read_text()) if partial.is_file() else {}
        result["error"] = "".join(traceback.format_exception_only(type(error), error)).strip()
    result.update(report)
    if "summary" not in report:  # a partial report: each finished run is its own summary (one repeat)
        result["summary"] = {run["impl"]: training.summarize_runs([run]) for run in report.get("completed", [])}
        result["ratios"] = training.ratios(result["summary"])
    summary = result["summary"]
    result["trl_installed"] = _importable("trl")
    result["trl_measured"] = {impl: impl in summary for impl in training.TRL_IMPLS}
    limits = {k: TARGETS[k] for k in ("wall_vs_trl_a2po", "wall_vs_trl_grpo", "memory_vs_trl_a2po")}
    result["targets"] = {**verdict(summary, "ours"), "limits": limits}
    result["bf16_weights_vs_trl"] = verdict(summary, "ours-bf16")
    result["ok"] = "error" not in result and "ours" in summary
    parts = [f"{impl} {s['wall_s']:.1f} s {_gib(s['peak_memory_gib'])} {_fmt(s.get('tokens_per_s'), 0)} tok/s "
             f"{_fmt((s.get('held') or {}).get('total_bytes_per_param'), 1)} B/param" for impl, s in summary.items()]
    t = result["targets"]
    if result["trl_measured"]["trl-a2po"]:
        memory = "met" if met(t["memory_vs_trl_a2po"]) else "NOT met"
        parts.append(f"default vs TRL A2PO: wall {_fmt(t['wall_vs_trl_a2po'])}x (<= {TARGETS['wall_vs_trl_a2po']}), "
                     f"memory {_fmt(t['memory_vs_trl_a2po'])}x (<= 1: {memory}; target "
                     f"{TARGETS['memory_vs_trl_a2po']}), tokens/s {_fmt(t['tokens_per_s_vs_trl_a2po'])}x"
                     + (f"; vs TRL GRPO: wall {_fmt(t['wall_vs_trl_grpo'])}x" if t["wall_vs_trl_grpo"] else ""))
    else:
        parts.append("TRL not measured (" + ("not installed" if not result["trl_installed"] else "failed") + ")")
    return result, "; ".join(parts)


def verdict(summary: dict[str, dict[str, Any]], impl: str) -> dict[str, float | None]:
    """`impl` against TRL's trainers: wall time, peak memory and tokens per second as ratios (None where one side
    was not measured)."""
    ours, a2po, grpo = (summary.get(k, {}) for k in (impl, "trl-a2po", "trl-grpo"))
    return {"wall_vs_trl_a2po": _ratio(ours.get("wall_s"), a2po.get("wall_s")),
            "wall_vs_trl_grpo": _ratio(ours.get("wall_s"), grpo.get("wall_s")),
            "memory_vs_trl_a2po": _ratio(ours.get("peak_memory_gib"), a2po.get("peak_memory_gib")),
            "tokens_per_s_vs_trl_a2po": _ratio(ours.get("tokens_per_s"), a2po.get("tokens_per_s"))}


def met(memory_ratio: float | None) -> bool:
    """The issue's memory bar for the default: at most TRL A2PO's peak."""
    return memory_ratio is not None and memory_ratio <= 1.0


# ----------------------------------------------------------------------------------------------------------------
# 2. learning on the GPU, from a model built there


def step_learning(args: argparse.Namespace, setting: Setting) -> tuple[dict[str, Any], str]:
    from benchmarks import learning

    # The phases' own time, inside the step's limit: building, evaluations and trainers' set-up take the rest.
    seconds = 0.7 * args.timeout
    result = learning.run("gpu" if setting.cuda else "tiny", setting.cuda, seconds, setting.workdir / "learning",
                          lambda so_far: args.save(so_far))
    result["ok"] = True
    return result, learning.summary_line(result)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ----------------------------------------------------------------------------------------------------------------
# 3. decode ms/step against the bandwidth floor (the `more` set from here on)


def copy_bandwidth(setting: Setting) -> dict[str, float]:
    """Bytes read plus bytes written per second by a large device-to-device copy (the floor's denominator)."""
    import torch

    nbytes = 2**30 if setting.cuda else 2**26
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=setting.device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    setting.sync()
    repeats = 20 if setting.cuda else 5
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    setting.sync()
    seconds = (time.perf_counter() - start) / repeats
    return {"copy_bytes": nbytes, "copy_s": seconds, "bandwidth_bytes_per_s": 2 * nbytes / seconds}


def step_decode(args: argparse.Namespace, setting: Setting) -> tuple[dict[str, Any], str]:
    import torch
    from transformers import AutoModelForCausalLM

    from a2po.decoding import decoder_for
    from a2po.rollout import sample_completions
    from benchmarks.training import EOS_ID, PAD_ID, SIZES

    shape = SIZES[setting.size]
    batch, new_tokens = (64, 256) if setting.cuda else (8, 16)
    dtype = getattr(torch, setting.dtype_name)
    model = AutoModelForCausalLM.from_pretrained(setting.model_dir(), dtype=dtype).to(setting.device).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, shape.vocab, (batch, shape.prompt_words), generator=generator).to(setting.device)
    mask = torch.ones_like(ids)
    # An end-of-sequence id the model cannot produce: every row decodes all `new_tokens` steps, as a timing needs.
    never = [shape.vocab]

    def autocast() -> contextlib.AbstractContextManager:  # as the trainer samples (`BaseTrainer._sample`)
        return torch.autocast("cuda", dtype=torch.bfloat16) if setting.cuda else contextlib.nullcontext()

    def ours(steps: int) -> float:
        setting.sync()
        start = time.perf_counter()
        with autocast():
            out = sample_completions(model, ids, mask, max_new_tokens=steps, eos_token_ids=never, pad_token_id=PAD_ID)
        setting.sync()
        assert out.shape == (batch, steps), out.shape
        return time.perf_counter() - start

    ours(8)  # warm-up: kernels, allocator
    prefill_s = min(ours(1) for _ in range(3))
    total_s = min(ours(new_tokens) for _ in range(2))
    decoder = type(decoder_for(model, capacity=shape.prompt_words + new_tokens)).__name__

    def generate() -> float:
        setting.sync()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        setting.sync()
        return time.perf_counter() - start

    with torch.no_grad():
        model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=4, pad_token_id=PAD_ID)
    generate_s = generate()

    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(setting)
    floor_ms = 1000 * weight_bytes / bandwidth["bandwidth_bytes_per_s"]
    ms_per_step = 1000 * total_s / new_tokens
    decode_ms = 1000 * (total_s - prefill_s) / (new_tokens - 1)
    result = {"ok": True, "batch": batch, "prompt_tokens": shape.prompt_words, "new_tokens": new_tokens,
              "decoder": decoder, "weight_bytes": weight_bytes, **bandwidth, "floor_ms_per_step": floor_ms,
              "prefill_s": prefill_s, "total_s": total_s, "ms_per_step": ms_per_step,
              "decode_ms_per_step": decode_ms, "tokens_per_s": batch * new_tokens / total_s,
              "vs_floor": decode_ms / floor_ms, "generate_ms_per_step": 1000 * generate_s / new_tokens,
              # a2po/decoding.py captures no CUDA graph: the "with a graph" half of the step 2 waits for one.
              "cuda_graph": None, "cuda_graph_note": "the rollout engine has no CUDA-graph decode step",
              "target_vs_floor": TARGETS["decode_vs_floor"]}
    line = (f"{decoder} {decode_ms:.2f} ms/step ({ms_per_step:.2f} with prefill) at batch {batch}, {new_tokens} "
            f"tokens; floor {floor_ms:.3f} ms ({weight_bytes / 1e6:.1f} MB at "
            f"{bandwidth['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s): {decode_ms / floor_ms:.1f}x "
            f"(<= {TARGETS['decode_vs_floor']:g}); generate {result['generate_ms_per_step']:.2f} ms/step; "
            "no CUDA graph in the engine")
    return result, line


# ----------------------------------------------------------------------------------------------------------------
# 4. LoRA


def step_lora(args: argparse.Namespace, setting: Setting) -> tuple[dict[str, Any], str]:
    run = train_run(setting, "a2po", lora=True)
    result: dict[str, Any] = {"run": run}
    training = Path(args.out) / "training.json"
    summary = json.loads(training.read_text()).get("summary", {}) if training.is_file() else {}
    trl = summary.get("trl-a2po", {}).get("peak_memory_gib")
    full = summary.get("ours", {}).get("peak_memory_gib")
    result.update(ok=True, peak_memory_gib=run["peak_memory_gib"], trl_a2po_peak_memory_gib=trl,
                  ours_full_peak_memory_gib=full, trl_measured=trl is not None,
                  vs_trl_a2po=_ratio(run["peak_memory_gib"], trl), vs_ours_full=_ratio(run["peak_memory_gib"], full),
                  target_vs_trl_a2po=TARGETS["lora_vs_trl_a2po"])
    line = (f"ours+LoRA peak {_gib(run['peak_memory_gib'])}, epoch {run['epoch_s']:.1f} s; "
            + (f"{result['vs_trl_a2po']:.2f}x TRL A2PO's {_gib(trl)} (<= {TARGETS['lora_vs_trl_a2po']})"
               if trl is not None else "TRL A2PO not measured in step 1")
            + (f"; {result['vs_ours_full']:.2f}x ours without LoRA" if full else ""))
    return result, line


# ----------------------------------------------------------------------------------------------------------------
# 5. a studio job: the worker module and a SQLite store


def smollm2_shaped(path: Path, full: bool) -> str:
    """A random-init Llama model (SmolLM2-135M's shape when `full`, else tiny) and a2po.testing's character
    tokenizer, its vocabulary padded to the model's so that every token the random model samples decodes to text."""
    import torch
    from tokenizers import models
    from transformers import AutoModelForCausalLM, LlamaConfig

    from a2po.testing import make_char_tokenizer

    tokenizer = make_char_tokenizer()
    vocab = tokenizer.get_vocab()
    shape = SMOLLM2 if full else dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=1024, tie_word_embeddings=True)
    size = len(vocab)
    vocab.update({f"<x{i}>": size + i for i in range(shape["vocab_size"] - size)})
    tokenizer.backend_tokenizer.model = models.WordLevel(vocab=vocab, unk_token="<unk>")
    config = LlamaConfig(**shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    # bf16 on a GPU, as SmolLM2's own checkpoint is stored (and so loads).
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if full else torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def studio_spec(model: str, cuda: bool) -> dict[str, Any]:
    """A dashboard-style A*-PO run: arithmetic prompts, stage 1 then one epoch of stage 2, no held-out set."""
    num_prompts, n, length, batch = (128, 8, 128, 8) if cuda else (8, 2, 8, 2)
    config = {"num_value_samples": n, "max_completion_length": length, "per_device_train_batch_size": batch,
              "num_train_epochs": 1, "use_cpu": not cuda, "report_to": "none", "save_strategy": "no",
              "logging_steps": 1, "seed": 0,
              # A random-init model solves nothing: keep every prompt instead of filtering them all out.
              "filter_all_incorrect": False}
    return {"name": "gpu-check", "action": "train", "model": model,
            "dataset": {"source": "arithmetic", "num_prompts": num_prompts, "difficulty": 1, "operations": "+",
                        "seed": 0, "eval_size": 0},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": config, "peft": None}


def step_studio(args: argparse.Namespace, setting: Setting, timeout: float) -> tuple[dict[str, Any], str]:
    from a2po.runspec import RunSpec
    from app.runtime.processes import with_project_path
    from storage import Store

    folder = setting.workdir / "studio"
    model = smollm2_shaped(folder / "model", full=setting.cuda)
    spec = RunSpec.from_dict(studio_spec(model, setting.cuda)).to_dict()
    store = Store(folder / "studio.db")
    run_id = store.create_run(spec["name"], spec["action"], spec, model="SmolLM2-135M's shape, random init",
                              dataset="arithmetic")
    command = [sys.executable, "-m", "app.runtime.worker", "--db", str(folder / "studio.db"), "--run-id", str(run_id),
               "--data-dir", str(folder / "data")]
    times: dict[str, float] = {}
    started = time.time()
    deadline = time.monotonic() + timeout
    with open(folder / "worker.log", "w") as worker_log:
        worker = subprocess.Popen(command, cwd=ROOT, env=with_project_path(os.environ), stdout=worker_log,
                                  stderr=subprocess.STDOUT)
    timed_out = False
    try:
        # Polled as the dashboard would see it: the first V* rows and the first logged step, from the store.
        while worker.poll() is None and time.monotonic() < deadline:
            if "first_values" not in times:
                run = store.get_run(run_id)
                if "claimed" not in times and run["started_at"]:
                    times["claimed"] = run["started_at"] - started
                if run["value_set_id"] and store.count_values(run["value_set_id"]):
                    times["first_values"] = time.time() - started
            elif "first_step" not in times and store.get_metrics(run_id, names=["loss"]):
                times["first_step"] = time.time() - started
            time.sleep(0.2)
        times["exit"] = time.time() - started
    except TimeUp:  # keep what the store shows so far
        timed_out = True
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    run = store.get_run(run_id)
    steps = store.step_times(run_id)
    steps_per_s = ((steps[-1][0] - steps[0][0]) / (steps[-1][1] - steps[0][1])
                   if len(steps) > 1 and steps[-1][1] > steps[0][1] else None)
    values = store.count_values(run["value_set_id"]) if run["value_set_id"] else 0
    result = {"ok": run["status"] == "finished" and not timed_out, "timed_out": timed_out, "status": run["status"],
              "error": run["error"],
              "worker_exit_code": worker.returncode, "spec": spec, "model_shape": SMOLLM2 if setting.cuda else "tiny",
              "seconds": times, "time_to_first_values_s": times.get("first_values"),
              "time_to_first_step_s": times.get("first_step"), "steps": len(steps), "steps_per_s": steps_per_s,
              "values_stored": values, "run_seconds": (run["finished_at"] or time.time()) - started,
              "logs": [r["message"] for r in store.get_logs(run_id)][-15:]}
    if not result["ok"]:
        result["worker_log_tail"] = (folder / "worker.log").read_text()[-3000:]
    first = times.get("first_values")
    line = (f"run {run['status']}: first V* rows after {_fmt(first, 1)} s (worker claimed at "
            f"{_fmt(times.get('claimed'), 1)} s), {values} V* rows, {len(steps)} steps at {_fmt(steps_per_s)} "
            f"steps/s, {result['run_seconds']:.1f} s in all")
    return result, line


# ----------------------------------------------------------------------------------------------------------------
# 6. A*-PO against GRPO, ours


def step_methods(args: argparse.Namespace, setting: Setting) -> tuple[dict[str, Any], str]:
    # A*-PO here, GRPO in a process of its own: each peak memory is one run's (and one process fewer to start).
    runs = {"a2po": train_run(setting, "a2po", filter_all_incorrect=False),
            "grpo": run_child(args, "--method", "grpo", "--no-filter")}
    a2po, grpo = runs["a2po"], runs["grpo"]
    result = {"ok": True, "runs": runs,
              "a2po_vs_grpo": {key: _ratio(a2po[key], grpo[key])
                               for key in ("epoch_s", "s_per_step", "tokens_per_step", "peak_memory_gib")}}
    line = "; ".join(f"{m} {r['epoch_s']:.1f} s/epoch, {r['s_per_step']:.2f} s/step, "
                     f"{r['tokens_per_step']:.0f} tok/step, {_gib(r['peak_memory_gib'])}" for m, r in runs.items())
    line += f"; A*-PO/GRPO epoch {result['a2po_vs_grpo']['epoch_s']:.2f}x"
    return result, line


# ----------------------------------------------------------------------------------------------------------------
# 7. the engines side by side, and a bf16 checkpoint's first step

# (row, what samples): ours with each sampler, then TRL's trainers (transformers' generate).
ENGINES = (("native", "ours, native decoder"), ("vllm", "ours, vLLM colocated"),
           ("vllm-sleep", "ours, vLLM colocated, sleep mode"), ("trl-a2po", "TRL A2POTrainer"),
           ("trl-grpo", "TRL GRPOTrainer"))
VLLM_VENV = ROOT / ".venv-vllm"  # vLLM's CPU build (Makefile, `.venv-vllm/.installed`)
TRL_MISSING = "trl is not installed here (pip install 'a2po-studio[bench]')"


def vllm_python(setting: Setting) -> tuple[str | None, str]:
    """The interpreter to run ours with vLLM in, or None and why there is none."""
    if _importable("vllm"):
        return sys.executable, ""
    if setting.cuda:
        return None, ("vLLM is not installed in this Python (the lent GPU machine has none, and its wheel is larger "
                      "than what travels there: shared/reference/gpu-checks.md)")
    if (VLLM_VENV / ".installed").is_file():
        return str(VLLM_VENV / "bin" / "python"), ""
    return None, "vLLM is not installed here (its CPU build: `make .venv-vllm/.installed`)"


def step_engines(args: argparse.Namespace, setting: Setting) -> tuple[dict[str, Any], str]:
    from benchmarks import training

    runs: dict[str, dict[str, Any]] = {}
    why_not: dict[str, str] = {}

    def measure(name: str, impl: str, python: str | None = None, **vllm: bool) -> None:
        job = training.Job(impl=impl, size=setting.size, model_dir=setting.model_dir(),
                           output_dir=str(setting.workdir / f"engine-{name}"),
                           result_path=str(setting.workdir / f"engine-{name}.json"), device=setting.device,
                           threads=None if setting.cuda else torch_threads(), **vllm)
        try:
            run = training.run_isolated(job, max_busy=1.0, wait=0, max_foreign=1.0, retries=0, python=python,
                                        log=lambda message: print(message, file=sys.stderr, flush=True))
        except RuntimeError as error:  # its output is in the log; the table says it failed
            print(error, file=sys.stderr, flush=True)
            why_not[name] = f"the run failed: {str(error).splitlines()[0]} (see gpu_check.log)"
            return
        runs[name] = {**training.summarize_runs([run]), "run": run}

    # Ours with its own decoder and TRL's trainers: step 1's runs of the same work when it ran in this $OUT.
    earlier_path = Path(args.out) / "training.json"
    earlier = json.loads(earlier_path.read_text()) if earlier_path.is_file() else {}
    if earlier.get("size") == setting.size:
        for name, impl in (("native", "ours"), ("trl-a2po", "trl-a2po"), ("trl-grpo", "trl-grpo")):
            if impl in earlier.get("summary", {}):
                runs[name] = {**earlier["summary"][impl], "from": "training.json"}
            else:
                why_not[name] = (TRL_MISSING if impl in training.TRL_IMPLS and not earlier.get("trl_installed")
                                 else "step 1 (training) did not measure it (see training.json)")
    else:
        measure("native", "ours")
        for impl in training.TRL_IMPLS:
            if _importable("trl"):
                measure(impl, impl)
            else:
                why_not[impl] = TRL_MISSING

    python, reason = vllm_python(setting)
    if python is None:
        why_not["vllm"] = why_not["vllm-sleep"] = reason
    else:
        if not setting.cuda:  # vLLM's CPU KV cache, in GiB (its default takes a share of the machine's memory)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        measure("vllm", "ours", python, use_vllm=True)
        platform = runs.get("vllm", {}).get("run", {}).get("vllm") or {}
        if "vllm" not in runs:
            why_not["vllm-sleep"] = "vLLM without sleep mode failed first"
        elif not platform.get("sleep_mode_available"):
            why_not["vllm-sleep"] = (f"vLLM has no sleep mode on {platform.get('device')} (CUDA only), and "
                                     "vllm_enable_sleep_mode is refused there")
        else:
            measure("vllm-sleep", "ours", python, use_vllm=True, vllm_enable_sleep_mode=True)

    rows = [engine_row(name, label, runs.get(name), why_not.get(name)) for name, label in ENGINES]
    bf16 = bf16_checkpoint_steps(setting)
    vllm_env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    memory = ("the CUDA allocator's peak (with vLLM: its weights and KV cache, vllm_gpu_memory_utilization's 0.3 of "
              "the GPU)" if setting.cuda else "the process's peak RSS (with vLLM: its KV cache, "
              f"VLLM_CPU_KVCACHE_SPACE={vllm_env.get('VLLM_CPU_KVCACHE_SPACE')} GiB)")
    notes = [f"{setting.size} shape on the {setting.device}: one epoch of A*-PO (of GRPO for TRL GRPO) on "
             f"benchmarks.training's work and settings; memory is {memory}",
             "vLLM's epoch and stage 1 include its engine's start; its decode ms/step do not"]
    if not setting.cuda:
        notes.append("CPU speed is not GPU speed: these figures show that every engine runs, not how fast on a GPU")
    result = {"ok": True, "engines": rows, "bf16_checkpoint": bf16, "vllm_python": python, "vllm_env": vllm_env,
              "notes": notes, "runs": runs}
    result["table"] = engines_table(result, markdown=False)
    result["markdown"] = engines_table(result, markdown=True)
    (Path(args.out) / "engines.md").write_text(result["markdown"] + "\n")
    print(result["table"], file=sys.stderr)
    parts = [f"{row['engine']} {row['epoch_s']:.1f} s {_gib(row['peak_memory_gib'])}" if row["measured"]
             else f"{row['engine']} not measured" for row in rows]
    parts.append(f"bf16 checkpoint, one step at {bf16['learning_rate']:g}: "
                 + ", ".join(f"{v['share_changed']:.1%} changed ({k})" for k, v in bf16["runs"].items()))
    return result, "; ".join(parts)


def engine_row(name: str, label: str, summary: dict[str, Any] | None, why_not: str | None) -> dict[str, Any]:
    """One row of the table: the run's figures, or why it was not measured."""
    if summary is None:
        return {"engine": name, "sampler": label, "measured": False, "why": why_not or "not run"}
    phases = summary.get("phases", {})
    run = summary.get("run", {})
    return {"engine": name, "sampler": label, "measured": True, "epoch_s": summary["wall_s"],
            "engine_start_s": run.get("engine_start_s"), "stage1_s": summary.get("stage1_s"),
            "stage2_s": summary.get("stage2_s"),
            "stage1_decode_ms_per_step": phases.get("values", {}).get("ms_per_step"),
            "stage2_decode_ms_per_step": phases.get("train", {}).get("ms_per_step"),
            "peak_memory_gib": summary["peak_memory_gib"], "from": summary.get("from", "this step")}


def engines_table(result: dict[str, Any], markdown: bool) -> str:
    """The engines as one table (plain text or markdown), the bf16 step and the notes below it."""
    from benchmarks.training import _fmt, format_table

    headers = ["engine", "sampler", "epoch s", "engine start s", "stage 1 s", "stage 2 s", "S1 decode ms/step",
               "S2 decode ms/step", "peak memory GiB", "note"]
    rows = []
    for row in result["engines"]:
        if row["measured"]:
            note = "step 1's run (training.json)" if row["from"] == "training.json" else ""
            rows.append([row["engine"], row["sampler"], _fmt(row["epoch_s"]), _fmt(row["engine_start_s"]),
                         _fmt(row["stage1_s"]), _fmt(row["stage2_s"]), _fmt(row["stage1_decode_ms_per_step"], 1),
                         _fmt(row["stage2_decode_ms_per_step"], 1), _fmt(row["peak_memory_gib"], 3), note])
        else:
            rows.append([row["engine"], row["sampler"], *["-"] * (len(headers) - 3), f"not measured: {row['why']}"])
    bf16 = result["bf16_checkpoint"]
    lines = [format_table(headers, rows, markdown), "",
             f"One A*-PO step at learning rate {bf16['learning_rate']:g} with bf16 compute, from a checkpoint stored "
             "in bf16 (share of the weights' elements the step changed):"]
    lines += [f"- {name}: {run['share_changed']:.2%} ({run['weights_dtype']} weights)"
              for name, run in bf16["runs"].items()]
    lines += ["", *(f"Note: {note}." for note in result["notes"])]
    return "\n".join(lines)


def bf16_checkpoint_steps(setting: Setting) -> dict[str, Any]:
    """One A*-PO step at the GPU preset's learning rate, bf16 compute, from a checkpoint stored in bf16: the share of
    weight elements it changes with the trainer's default fp32 master weights, and with the weights kept in bf16 as
    stored (TRL's default; bf16 rounds away updates under half its step)."""
    import gc

    import torch
    from datasets import Dataset

    from a2po import A2POConfig, A2POTrainer
    from a2po.presets import PRESETS
    from benchmarks.training import SIZES, binary_reward, build_model, make_prompts, make_tokenizer

    if setting.dtype_name == "bfloat16":
        model = setting.model_dir()
    else:
        path = setting.workdir / "bf16" / f"model-{setting.size}"
        model = str(path) if (path / "tokenizer.json").is_file() else build_model(setting.size, path.parent, "bfloat16")
    learning_rate = PRESETS["step-by-step-gpu"]["config"]["learning_rate"]
    dataset = Dataset.from_dict({"prompt": make_prompts(setting.size, 8)})
    runs = {}
    for name, init in (("fp32 master weights (the default)", {}),
                       ("kept in bf16 as stored (model_init_kwargs dtype)", {"dtype": torch.bfloat16})):
        args = A2POConfig(output_dir=str(setting.workdir / "bf16-run"), num_value_samples=2, beta1=0.5, beta2=1e-3,
                          per_device_train_batch_size=8, max_steps=1, learning_rate=learning_rate, bf16=True,
                          use_cpu=not setting.cuda, max_completion_length=min(32, SIZES[setting.size].max_completion),
                          filter_all_incorrect=False, save_values=False, gradient_checkpointing=True, seed=0,
                          report_to="none", save_strategy="no", disable_tqdm=True, model_init_kwargs=init or None)
        trainer = A2POTrainer(model=model, reward_funcs=binary_reward, args=args, train_dataset=dataset,
                              processing_class=make_tokenizer(setting.size))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        after = dict(trainer.model.named_parameters())
        changed = sum(int((before[n] != after[n]).sum()) for n in before)
        runs[name] = {"share_changed": changed / sum(p.numel() for p in before.values()),
                      "weights_dtype": str(next(iter(after.values())).dtype).removeprefix("torch."),
                      "steps": trainer.state.global_step}
        del trainer, before, after
        gc.collect()
        if setting.cuda:
            torch.cuda.empty_cache()
    return {"learning_rate": learning_rate, "stored_dtype": "bfloat16", "runs": runs}


# ----------------------------------------------------------------------------------------------------------------
# Command line


def record_failure(out: Path, step: str, rc: int, limit: float | None) -> str:
    """Mark a step failed, keeping whatever it wrote; the line the script prints for it."""
    path = out / f"{step}.json"
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        result = {"step": step}
    timed_out = rc in (124, 137)
    result.update(ok=False, rc=rc, timed_out=timed_out, limit_s=limit, not_run=not limit)
    write_json(path, result)
    if not limit:
        return f"{step}: NOT RUN (the script's time budget is spent)"
    reason = f"timed out after {limit:g} s" if timed_out else f"exit {rc}"
    # The exception's own line: a traceback's last, or the first of a message that goes on with a run's output.
    raised = re.findall(r"^(?:\w+\.)*\w*(?:Error|Exception|TimeUp|Exit):.*$", result.get("error") or "", re.M)
    error = f": {raised[-1][:200]}" if raised else ""
    partial = f" {result['line']}" if result.get("line") else ""
    return f"{step}: FAILED ({reason}{error}; see gpu_check.log){partial}"


def plan(cpu: bool, names: Sequence[str] = ()) -> tuple[int, list[tuple[str, int]]]:
    """The budget (seconds) and each step to run with its share (percent of the budget), in order: the named steps
    and sets (`SETS`; none: the first set, the GPU's core). An unknown name is an error naming the known ones."""
    mode = "cpu" if cpu else "gpu"
    sets = SETS[mode]
    chosen: list[str] = []
    for name in names or [next(iter(sets))]:
        if name == "all":
            chosen += STEPS
        elif name in sets or name in ("core", "more"):
            chosen += sets.get(name) or SETS["gpu"][name]
        elif name in STEPS:
            chosen.append(name)
        else:
            raise ValueError(f"unknown step {name!r}: name steps ({', '.join(STEPS)}) or sets (core, more, all)")
    ordered = [step for step in STEPS if step in chosen]
    return BUDGETS[mode], [(step, SHARES[mode][step]) for step in ordered]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=(*STEPS, "run", "failed", "plan"))
    parser.add_argument("names", nargs="*", help="failed: the step that failed; plan: the steps or sets to run")
    parser.add_argument("--out", help="the results folder (run: the result file)")
    parser.add_argument("--workdir", help="models and run outputs, shared by the steps (default: a temporary one)")
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU even where a GPU is present")
    parser.add_argument("--timeout", type=float, default=600.0, help="studio: seconds to wait for the job")
    parser.add_argument("--method", choices=("a2po", "grpo"), default="a2po", help="run: the method")
    parser.add_argument("--lora", action="store_true", help="run: with LoRA")
    parser.add_argument("--no-filter", action="store_true", help="run: filter_all_incorrect off")
    parser.add_argument("--rc", type=int, default=1, help="failed: the step's exit code")
    parser.add_argument("--limit", type=float, default=None, help="failed: the step's time limit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.step == "plan":  # for scripts/gpu_check.sh: "budget N", then "step share" lines
        try:
            budget, steps = plan(args.cpu, args.names)
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        print(f"budget {budget}", *(f"{step} {share}" for step, share in steps), sep="\n")
        return 0
    if not args.out:
        print("--out is required", file=sys.stderr)
        return 2
    if args.step == "failed":
        print(record_failure(Path(args.out), args.names[0], args.rc, args.limit), flush=True)
        return 0
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            args.workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-"))
        args.workdir = Path(args.workdir)
        args.workdir.mkdir(parents=True, exist_ok=True)
        setting = Setting(args.cpu, args.workdir)
        if args.step == "run":
            write_json(Path(args.out), train_run(setting, args.method, lora=args.lora,
                                                 filter_all_incorrect=not args.no_filter))
            return 0
        return run_step(args, setting)


def run_step(args: argparse.Namespace, setting: Setting) -> int:
    steps: dict[str, Callable[[], tuple[dict[str, Any], str]]] = {
        "training": lambda: step_training(args, setting),
        "learning": lambda: step_learning(args, setting),
        "decode": lambda: step_decode(args, setting),
        "lora": lambda: step_lora(args, setting),
        "studio": lambda: step_studio(args, setting, args.timeout),
        "methods": lambda: step_methods(args, setting),
        "engines": lambda: step_engines(args, setting),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def time_up(*_: Any) -> None:
        raise TimeUp(f"{args.step} ran out of time")

    signal.signal(signal.SIGTERM, time_up)
    start = time.perf_counter()
    base = {"step": args.step, "device": setting.device, "size": setting.size, "machine": setting.info()}
    saved: dict[str, Any] = {}

    def save(so_far: dict[str, Any]) -> None:
        """What a step measured so far, written at once: kept if the step is cut."""
        saved.clear()
        saved.update(so_far)
        write_json(out / f"{args.step}.json", {**base, **so_far, "ok": False, "partial": True,
                                                "step_s": time.perf_counter() - start})

    args.save = save
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout is for the step's line
            result, line = steps[args.step]()
    except Exception:  # recorded with what the step saved; the script's `failed` prints the step's line
        traceback.print_exc()
        result, line = {**saved, "ok": False, "partial": bool(saved), "error": traceback.format_exc()}, ""
    result = {**base, **result, "step_s": time.perf_counter() - start, "line": line}
    write_json(out / f"{args.step}.json", result)
    if not result.get("ok"):
        return 1
    print(f"{args.step} [{setting.device}, {result['step_s']:.0f} s]: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
