"""Latency of a playground request (`app.runtime.playground`), with the machine idle and while a training run works.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/playground_latency.py --model tiny
    OMP_NUM_THREADS=1 .venv/bin/python scripts/playground_latency.py --model SmolLM2-135M-Instruct

The request is the teaching demo's (`a2po.presets`: 2-digit sums, 16 new tokens, temperature 1) on one of its
prompts, a greedy completion and 4 samples for each policy; the trained policy is a second copy of the model, so two
models load as for a finished full-weight run. Measured: a cold request (process start, imports, loading both
models), then warm ones (cached models); then the same while `python -m a2po train` runs the teaching demo on the same
model in the background (torch's default threads, normal priority, as a studio worker). The playground runs as in the
studio: `nice` +10, one torch thread (`--nice`, `--threads` change that, to compare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(client, request, repeat: int) -> tuple[float, list[float]]:
    """(cold seconds, warm seconds...) of `request`: the first after a fresh start, then `repeat` cached ones."""
    client.close()
    started = time.perf_counter()
    first = client.ask(request)
    cold = time.perf_counter() - started
    assert not first["cached"]
    warm = []
    for _ in range(repeat):
        started = time.perf_counter()
        assert client.ask(request)["cached"]
        warm.append(time.perf_counter() - started)
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (a random-init tiny model) or a model id")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=45.0, help="seconds the training runs before measuring")
    options = parser.parse_args()

    from a2po.answers import prompt_question
    from a2po.data import arithmetic_dataset
    from a2po.models import resolve_model
    from a2po.runspec import RunSpec, preset_spec
    from app.access.policy import Limits
    from app.runtime.playground.client import PlaygroundClient, build_request

    work = Path(tempfile.mkdtemp(prefix="playground-latency-"))
    if options.model == "tiny":
        from a2po.testing import make_tiny_model

        make_tiny_model(work / "tiny")
        model = str(work / "tiny")
    else:
        started = time.perf_counter()
        model = resolve_model(options.model)  # the default model's one-time conversion, if not done yet
        print(f"model ready in {time.perf_counter() - started:.1f} s: {model}")
    spec = RunSpec.from_dict({**preset_spec(), "model": model}).to_dict()
    spec["config"]["use_cpu"] = True
    data = spec["dataset"]
    question = prompt_question(arithmetic_dataset(4, data["operations"], data["difficulty"], data["seed"])["prompt"][0])
    request = build_request(prompt=question, num_samples=4, answer=None, limits=Limits(), run={"id": 0, "config": spec},
                            weights=(Path(model), "final model"))
    client = PlaygroundClient(work / "data", nice=options.nice, threads=options.threads, idle_timeout=600)
    print(f"request: {question!r}, greedy + 4 samples per policy, {request['max_new_tokens']} new tokens at most; "
          f"playground nice +{options.nice}, {options.threads} thread(s); {os.cpu_count()} CPU cores")

    results = {}
    try:
        results["idle"] = measure(client, request, options.repeat)
        command = [sys.executable, "-m", "a2po", *RunSpec.from_dict(spec).to_cli_args(), "--output_dir",
                   str(work / "train"), "--save_strategy", "no", "--eval_size", "0", "--filter_all_incorrect", "false",
                   "--num_train_epochs", "1000"]
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        with open(work / "train.log", "wb") as log:
            trainer = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(options.warmup)
            if trainer.poll() is not None:
                raise SystemExit(f"the training run exited early: {(work / 'train.log').read_text()[-2000:]}")
            results["training"] = measure(client, request, options.repeat)
        finally:
            trainer.terminate()
            trainer.wait()
    finally:
        client.close()
    for name, (cold, warm) in results.items():
        print(f"{name:>9}: cold {cold:6.2f} s; warm median {statistics.median(warm):5.2f} s "
              f"(min {min(warm):.2f}, max {max(warm):.2f}, {len(warm)} requests)")


if __name__ == "__main__":
    main()
