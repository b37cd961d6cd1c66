"""What one chunk of a chunked run costs beyond its training (`app.runtime.chunks`): restoring the run and saving it
again, by model size, full fine-tuning against LoRA.

    python scripts/chunk_overhead.py                              # the table: every size, full and LoRA
    python scripts/chunk_overhead.py --sizes tiny,135m --variants lora --chunks 5 --out chunk-cost.json

Sizes: `tiny` (`a2po.testing.make_tiny_model`), `135m` (SmolLM2-135M-Instruct, the offline default), `0.5b`
(Qwen2.5-0.5B-Instruct's shape, random weights built in code, the character tokenizer; nothing downloaded). Every
run is fp32, the trainer's default, except `0.5b` full fine-tuning, loaded in bf16 (`model_init_kwargs`) to keep
this machine's memory under ~8 GB: its fp32 checkpoint is twice the bytes (weights 4 bytes a parameter and AdamW's
two moments 8, against 2 and 4), so the table adds a row of that, scaled from the bf16 row (marked "scaled").

For each size and variant it makes a chunked run in a temporary data folder (8 arithmetic prompts, N = 2, 16
completion tokens, 4 prompts a step, on the CPU; `0.5b`: 4 tokens and 2 prompts a step, else its step takes several
minutes here: its step column is not comparable, the rest does not depend on it) and drives it as a ZeroGPU page does:
`chunks.claim` in this process, the chunk (`chunks.run_chunk`, budget 0: one stage-1 batch or one training step, then
a checkpoint) in a fresh process of its own, `chunks.settle` after it. The first chunk runs stage 1, the second the
first step (nothing to restore yet); each of the next `--chunks` restores the run, trains one step and saves it.
Inside each it times:

- `load`: the trainer built from the spec (model and tokenizer from disk, the reference copy or the LoRA wrapper);
- `restore`: the checkpoint read back (weights or adapter, optimizer, scheduler, RNG, trainer state);
- `save`: the checkpoint written (the same parts);
- `step`: the training step (`Trainer.training_step`: sampling, scoring, forward, backward) and the optimizer step;
  `total`: the whole call; `overhead` = total - step;

and records the checkpoint's bytes on disk and the chunk process's peak RSS (`wait4`). It prints the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("load", "restore", "save", "step")
SIZES = ("tiny", "135m", "0.5b")
# Qwen2.5-0.5B-Instruct's config.json (the GPU preset's model), less what random weights make moot.
QWEN05_SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151_936, "max_position_embeddings": 32_768,
                "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}


def make_model(size: str, folder: Path) -> tuple[str, dict]:
    """The model id for `size` (a folder built in `folder`, or the default model's alias) and the `config` fields
    its run needs."""
    if size == "135m":
        from a2po.models import DEFAULT_MODEL, resolve_model

        resolve_model(DEFAULT_MODEL)  # the one-time GGUF conversion is not a chunk's cost
        return DEFAULT_MODEL, {}
    path = folder / f"model-{size}"
    if not (path / "config.json").is_file():
        import torch
        from transformers import AutoModelForCausalLM, Qwen2Config

        from a2po.testing import make_char_tokenizer, make_tiny_model

        if size == "tiny":
            make_tiny_model(path)
        else:
            tokenizer = make_char_tokenizer()
            config = Qwen2Config(**QWEN05_SHAPE, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
            torch.manual_seed(0)
            # Stored in bf16, as the hub's Qwen2.5-0.5B-Instruct is; the trainer loads it in fp32 unless told.
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
            model.generation_config.pad_token_id = tokenizer.pad_token_id
            model.generation_config.eos_token_id = [tokenizer.eos_token_id]
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            del model
    return str(path), {}


def run_spec(model: str, lora: bool, chunks: int, config: dict, light: bool = False) -> dict:
    """The measured run; `light`: 2 prompts a step and 4 completion tokens, for a step this CPU does in a minute."""
    return {"name": "chunk-cost-" + ("lora" if lora else "full"), "action": "train", "model": model,
            "runner": "chunked",
            "dataset": {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 0},
            "rewards": [{"name": "exact_match", "weight": 1.0}],
            "config": {"num_value_samples": 2, "max_completion_length": 4 if light else 16, "max_steps": chunks + 2,
                       "per_device_train_batch_size": 2 if light else 4, "value_batch_size": 8, "logging_steps": 1,
                       "seed": 0, "save_steps": 0, "learning_rate": 1e-5, "filter_all_incorrect": False,
                       "gradient_checkpointing": False, "use_cpu": True, **config},
            "peft": {"r": 16, "lora_alpha": 32} if lora else None}


# ------------------------------------------------------------------------------------------------ in the chunk


@contextlib.contextmanager
def timers(times: dict[str, float]):
    """Add the seconds spent in the library calls behind each part to `times` while inside."""
    from transformers import Trainer

    from a2po.runspec import RunSpec

    patched = {(RunSpec, "build_trainer"): "load", (Trainer, "_load_from_checkpoint"): "restore",
               (Trainer, "_load_optimizer_and_scheduler"): "restore", (Trainer, "_load_rng_state"): "restore",
               (Trainer, "_save_checkpoint"): "save", (Trainer, "training_step"): "step"}
    originals = {key: getattr(*key) for key in patched}
    for (owner, name), part in patched.items():
        setattr(owner, name, timed(originals[(owner, name)], times, part))
    create_optimizer = Trainer.create_optimizer

    def timed_optimizer(self, *args, **kwargs):  # the optimizer step happens outside `training_step`
        optimizer = create_optimizer(self, *args, **kwargs)
        optimizer.step = timed(optimizer.step, times, "step")
        return optimizer

    Trainer.create_optimizer = timed_optimizer
    try:
        yield
    finally:
        for (owner, name), function in originals.items():
            setattr(owner, name, function)
        Trainer.create_optimizer = create_optimizer


def timed(function, times: dict[str, float], part: str):
    """`function`, adding the seconds of each call to `times[part]`."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            times[part] += time.perf_counter() - start
    return wrapper


def one_chunk(data_dir: str, run_id: int, out: str) -> int:
    """The chunk process: one `run_chunk` of the claimed run, its parts' seconds written to `out` as JSON."""
    from app.runtime.chunks import run_chunk

    times: dict[str, float] = defaultdict(float)
    with timers(times):
        result = run_chunk(data_dir, run_id, 0.0)
    Path(out).write_text(json.dumps({"result": result, "times": times}))
    return 0


# ------------------------------------------------------------------------------------------------ the parent


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def chunk(store, data: Path, run_id: int) -> dict:
    """Claim the run, run one chunk in a fresh process, settle it; its timings, checkpoint bytes and peak RSS."""
    from app.runtime import chunks
    from app.runtime.data_folder import DataFolder

    if chunks.claim(store, data, store.get_run(run_id), pid=os.getpid()) is None:
        raise RuntimeError(f"run {run_id} could not be claimed: {store.get_run(run_id)['error']}")
    out = data / "chunk-times.json"
    out.unlink(missing_ok=True)
    log = data / "chunk.log"  # the chunk's progress bars and warnings, kept out of the table
    with log.open("a") as output:
        process = subprocess.Popen([sys.executable, __file__, "--one-chunk", str(data), str(run_id), str(out)],
                                   stdout=output, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    outcome = chunks.settle(store, data, run_id, f"exited {process.returncode}")
    if process.returncode or outcome not in ("continues", "finished"):
        logs = [row["message"] for row in store.get_logs(run_id)][-5:]
        raise RuntimeError(f"chunk of run {run_id} ended {outcome} (exit {process.returncode}): {logs}\n"
                           + log.read_text()[-3000:])
    found = json.loads(out.read_text())
    output = DataFolder(data).run_output(run_id)
    checkpoints = sorted(output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    row = {part: round(found["times"].get(part, 0.0), 3) for part in PARTS}
    row["total"] = round(found["result"]["seconds"], 3)
    row["overhead"] = round(row["total"] - row["step"], 3)
    row["checkpoint_mb"] = round(folder_bytes(checkpoints[-1]) / 1e6, 1) if checkpoints else 0.0
    row["peak_rss_mb"] = round(usage.ru_maxrss / 1024, 1)  # Linux: KiB
    return row


def measure(size: str, lora: bool, chunks: int, folder: Path) -> list[dict]:
    from a2po.runspec import RunSpec
    from storage import Store

    model, config = make_model(size, folder)
    if size == "0.5b" and not lora:
        config = {"model_init_kwargs": {"dtype": "bfloat16"}}  # fp32 would need ~10 GB here (see the docstring)
    with tempfile.TemporaryDirectory(prefix="chunk-cost-", dir=folder) as run_folder:
        data = Path(run_folder)
        store = Store(data / "studio.db")
        clean = RunSpec.from_dict(run_spec(model, lora, chunks, config, light=size == "0.5b")).to_dict()
        run_id = store.create_run(clean["name"], "train", clean, model=model)
        chunk(store, data, run_id)  # stage 1: one batch of the 8 prompts
        chunk(store, data, run_id)  # step 1: nothing to restore yet
        rows = []
        for _ in range(chunks):
            row = chunk(store, data, run_id)
            rows.append(row)
            print(f"  {size} {'lora' if lora else 'full'}: " + ", ".join(f"{k} {v}" for k, v in row.items()),
                  flush=True)
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--variants", default="full,lora", help="full, lora or both (default)")
    parser.add_argument("--chunks", type=int, default=3, help="measured chunks per size and variant (default 3)")
    parser.add_argument("--work-dir", type=Path, help="where models and runs go (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write every chunk's figures as JSON")
    parser.add_argument("--one-chunk", nargs=3, metavar=("DATA_DIR", "RUN_ID", "OUT"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if options.one_chunk:
        data_dir, run_id, out = options.one_chunk
        return one_chunk(data_dir, int(run_id), out)
    sizes, variants = options.sizes.split(","), options.variants.split(",")
    unknown = sorted(set(sizes) - set(SIZES)) + sorted(set(variants) - {"full", "lora"})
    if unknown or options.chunks < 1:
        parser.error(f"unknown sizes or variants {unknown} (sizes: {', '.join(SIZES)}; variants: full, lora), or "
                     "--chunks below 1")
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs", flush=True)
    results = {}
    with contextlib.ExitStack() as stack:
        folder = options.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chunk-cost-")))
        folder.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            for variant in variants:
                rows = measure(size, variant == "lora", options.chunks, folder)
                results[f"{size} {variant}"] = {
                    "chunks": rows, "median": {k: statistics.median(r[k] for r in rows) for k in rows[0]}}
    columns = (*PARTS, "overhead", "total", "checkpoint_mb", "peak_rss_mb")
    print(f"\nMedians of {options.chunks} chunks (load average at the end {os.getloadavg()[0]:.1f}):\n")
    print("| model | variant | " + " | ".join(columns) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in columns) + " |")
    for name, result in results.items():
        size, variant = name.split()
        m = result["median"]
        print(f"| {size} | {variant} | " + " | ".join(f"{m[k]:.1f}" if k.endswith("mb") else f"{m[k]:.2f}"
                                                      for k in columns) + " |")
        if size == "0.5b" and variant == "full":
            scaled = {"restore": 2 * m["restore"], "save": 2 * m["save"], "checkpoint_mb": 2 * m["checkpoint_mb"]}
            print(f"| 0.5b | full, fp32 (scaled) | | {scaled['restore']:.2f} | {scaled['save']:.2f} | | | | "
                  f"{scaled['checkpoint_mb']:.1f} | |")
    if options.out:
        options.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
