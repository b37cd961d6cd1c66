"""What one chunk of a chunked run costs beyond its training (`app.runtime.chunks`): restoring the run and saving it
again.

    python scripts/chunk_overhead.py                       # SmolLM2-135M-Instruct, full fine-tuning and LoRA
    python scripts/chunk_overhead.py --chunks 5 --out chunk-overhead.json

For each variant it makes a chunked run in a temporary data folder (8 arithmetic prompts, N = 2, 16 completion
tokens, 4 prompts a step, on the CPU unless a GPU is there), runs stage 1 in one chunk and the first step (nothing
to restore yet) in another, then `--chunks` stage-2 chunks of one training step each (budget ~0: each chunk stops
after its first step, with a checkpoint), every one through `app.runtime.chunks.run_chunk` as a ZeroGPU call runs it
(here in this process, one after the other; nothing is kept between calls). It times, inside every stage-2 chunk:

- `load`: the trainer built from the spec (model and tokenizer from disk, the reference copy or the LoRA wrapper);
- `values`: stage 1 with every prompt already stored (reading the V* rows, the table rebuilt);
- `restore`: the checkpoint read back (weights or adapter, optimizer, scheduler, RNG, trainer state);
- `save`: the checkpoint written (the same parts);
- `step`: the training step itself (`Trainer.training_step`: sampling, scoring, forward, backward) and the
  optimizer step; `total`: the whole call. `overhead` = total - step.

and prints the medians (and writes every chunk with `--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("load", "values", "restore", "save", "step")


def spec(model: str, lora: bool, steps: int) -> dict:
    return {"name": "chunk-overhead-" + ("lora" if lora else "full"), "action": "train", "model": model,
            "runner": "chunked",
            "dataset": {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 0},
            "rewards": [{"name": "exact_match", "weight": 1.0}],
            "config": {"num_value_samples": 2, "max_completion_length": 16, "max_steps": steps + 2,
                       "per_device_train_batch_size": 4, "value_batch_size": 8, "logging_steps": 1, "seed": 0,
                       "save_steps": 0, "learning_rate": 1e-5, "filter_all_incorrect": False,
                       "gradient_checkpointing": False},
            "peft": {"r": 16, "lora_alpha": 32} if lora else None}


@contextlib.contextmanager
def timers(times: dict[str, float]):
    """Add the seconds spent in the library calls behind each part to `times` while inside."""
    from transformers import Trainer

    from a2po.runspec import RunSpec
    from a2po.trainer import A2POTrainer

    patched = {(RunSpec, "build_trainer"): "load", (A2POTrainer, "estimate_optimal_values"): "values",
               (Trainer, "_load_from_checkpoint"): "restore", (Trainer, "_load_optimizer_and_scheduler"): "restore",
               (Trainer, "_load_rng_state"): "restore", (Trainer, "_save_checkpoint"): "save",
               (Trainer, "training_step"): "step"}
    originals = {key: getattr(*key) for key in patched}

    for (owner, name), part in patched.items():
        setattr(owner, name, timed(originals[(owner, name)], times, part))
    try:
        yield
    finally:
        for (owner, name), function in originals.items():
            setattr(owner, name, function)


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


def optimizer_step_timer(times: dict[str, float]):
    """The optimizer step happens outside `training_step`: time it through the optimizer the Trainer builds."""
    from transformers import Trainer

    original = Trainer.create_optimizer

    def create_optimizer(self, *args, **kwargs):
        optimizer = original(self, *args, **kwargs)
        optimizer.step = timed(optimizer.step, times, "step")
        return optimizer

    Trainer.create_optimizer = create_optimizer
    return lambda: setattr(Trainer, "create_optimizer", original)


def measure(model: str, lora: bool, chunks: int) -> list[dict[str, float]]:
    from app.runtime.chunks import run_chunk
    from storage import Store

    with tempfile.TemporaryDirectory(prefix="chunk-overhead-") as folder:
        data = Path(folder)
        store = Store(data / "studio.db")
        from a2po.runspec import RunSpec

        clean = RunSpec.from_dict(spec(model, lora, chunks)).to_dict()
        run_id = store.create_run(clean["name"], "train", clean, model=model)
        first = run_chunk(store.path, data, run_id, 0.0)  # stage 1: one batch of the 8 prompts
        assert first["outcome"] == "continues" and first["prompts_done"] == 8, first
        second = run_chunk(store.path, data, run_id, 0.0)  # step 1: nothing to restore yet
        assert second["outcome"] == "continues" and second["step"] == 1, second
        rows = []
        for _ in range(chunks):
            times: dict[str, float] = defaultdict(float)
            restore_optimizer = optimizer_step_timer(times)
            try:
                with timers(times):
                    result = run_chunk(store.path, data, run_id, 0.0)
            finally:
                restore_optimizer()
            if result["outcome"] not in ("continues", "finished"):
                raise RuntimeError(f"chunk ended {result['outcome']}: {result.get('error')}")
            row = {part: round(times[part], 3) for part in PARTS}
            row["total"] = round(result["seconds"], 3)
            row["overhead"] = round(result["seconds"] - times["step"], 3)
            rows.append(row)
            print(f"  {'lora' if lora else 'full'} chunk (step {result['step']}): " +
                  ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--chunks", type=int, default=3, help="stage-2 chunks per variant (default 3)")
    parser.add_argument("--variants", default="full,lora")
    parser.add_argument("--out", type=Path, help="write every chunk's timings as JSON")
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from a2po.models import resolve_model

    resolve_model(options.model)  # the one-time GGUF conversion of the default model is not a chunk's cost
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{'cuda' if torch.cuda.is_available() else 'cpu'}", flush=True)
    results = {}
    for variant in options.variants.split(","):
        rows = measure(options.model, variant == "lora", options.chunks)
        results[variant] = {"chunks": rows, "median": {k: round(statistics.median(r[k] for r in rows), 3)
                                                       for k in rows[0]}}
    print("\n| variant | load s | values s | restore s | save s | step s | total s | overhead s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for variant, result in results.items():
        m = result["median"]
        print(f"| {variant} | " + " | ".join(f"{m[k]:.2f}" for k in (*PARTS, "total", "overhead")) + " |")
    if options.out:
        options.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
