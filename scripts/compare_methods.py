"""A*-PO against GRPO on the teaching demo, from the dashboard: for each run seed, "A*-PO vs GRPO" (`/launch_pair`,
the Launch page's button) with the teaching-demo preset (SmolLM2-135M-Instruct, 2-digit sums, N = G = 8, GRPO's batch
8 x 8 completions: the same 8 prompts per step), both runs to the end, then each run's held-out accuracy against
wall time, its final accuracy, the time A*-PO needs to reach GRPO's final accuracy (with its stage 1 and without),
and peak memory, as the Compare page computes them (`app.web.comparison`).

    python scripts/compare_methods.py DATA_DIR [--seeds 0 1 2] [--port 7873] [--spec '{"config": {...}}']

Starts `python -m app` on DATA_DIR once. The scheduler runs one run at a time on a CPU (a run takes the machine),
so the two runs of a pair do not share the cores; nothing else should use the CPU meanwhile. Prints one JSON line
per run and one verdict line per seed. Each seed's pair shares nothing: a seed is part of V*'s settings, so every
A*-PO run samples its own stage 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gradio_client import Client
from studio_client import wait_for_port

ROOT = Path(__file__).resolve().parents[1]


def wait_finished(client: Client, run_id: int) -> dict:
    while True:
        status = client.predict(run_id=run_id, api_name="/status")
        if status["status"] in ("finished", "failed", "stopped", "interrupted"):
            return status
        time.sleep(2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--port", type=int, default=7873)
    parser.add_argument("--spec", default="{}", help="JSON merged into each pair's A*-PO spec (the teaching demo's)")
    options = parser.parse_args()
    extra = json.loads(options.spec)

    sys.path.insert(0, str(ROOT))
    from app.web import comparison
    from storage import Store

    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(ROOT))
    app = subprocess.Popen([sys.executable, "-m", "app", "--port", str(options.port), "--data-dir",
                            str(options.data_dir)], cwd=ROOT, env=env)
    try:
        wait_for_port(options.port)
        client = Client(f"http://127.0.0.1:{options.port}/", verbose=False)
        store = Store(options.data_dir / "studio.db")
        for seed in options.seeds:
            spec = {"name": f"duel-seed{seed}", **extra, "config": {**extra.get("config", {}), "seed": seed}}
            pair = client.predict(spec=spec, api_name="/launch_pair")
            timelines = {}
            for method in ("a2po", "grpo"):
                status = wait_finished(client, pair[method]["run_id"])
                run = store.get_run(pair[method]["run_id"])
                timelines[method] = line = comparison.store_timeline(store, run)
                print(json.dumps({
                    "seed": seed, "method": method, "run_id": run["id"], "status": status["status"],
                    "error": status.get("error"), "final_accuracy": line.final_accuracy,
                    "stage1_s": round(line.stage1_seconds, 1), "stage1_tokens": line.stage1_tokens,
                    "peak_memory_gb": line.peak_memory_gb,
                    "curve": [(p.step, round(p.seconds, 1), p.tokens, p.accuracy) for p in line.points]}),
                    flush=True)
            print(f"seed {seed}: {comparison.verdict(timelines['a2po'], timelines['grpo'])}", flush=True)
    finally:
        app.terminate()
        app.wait(timeout=60)


if __name__ == "__main__":
    main()
