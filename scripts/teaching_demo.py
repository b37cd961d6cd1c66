"""The teaching-demo preset as a teacher runs it: press Train (an empty `/launch` spec: the form's defaults) with
run seed 0, 1, 2 in turn, and time each from the click to "finished", with held-out accuracy before and after.

    python scripts/teaching_demo.py DATA_DIR [--seeds 0 1 2] [--port 7872] [--spec '{"config": {...}}']

Starts `python -m app` on DATA_DIR once and runs the seeds one after another (one run at a time, as the
scheduler would anyway). A fresh DATA_DIR includes the one-time conversion of the default model in the first
run: the script reports it separately (the worker's log says how long it took). Prints one JSON line per seed
and a summary line; nothing else should use the CPU meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gradio_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed

OFFLINE = {"HF_HUB_OFFLINE": "1"}


def accuracy_points(client: Client, run_id: int) -> list[tuple[int, float]]:
    rows = client.predict(run_id=run_id, after_id=0, api_name="/metrics")
    return sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval_accuracy")


def run_seed(client: Client, seed: int, extra: dict) -> dict:
    spec = {"name": f"teaching-demo-seed{seed}", **extra, "config": {**extra.get("config", {}), "seed": seed}}
    start = time.time()
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    status = {}
    while True:
        status = client.predict(run_id=run_id, api_name="/status")
        if status["status"] in ("finished", "failed", "stopped", "interrupted"):
            break
        time.sleep(1.0)
    wall = time.time() - start
    points = accuracy_points(client, run_id)
    values = (status.get("values") or {}).get("summary") or {}
    train_summary = values.get("train", values) if isinstance(values, dict) else {}
    return {"seed": seed, "run_id": run_id, "status": status["status"], "error": status.get("error"),
            "wall_s": round(wall, 1), "accuracy_before": points[0][1] if points else None,
            "accuracy_after": points[-1][1] if points else None, "eval_points": points,
            "steps": max((s for s, _ in points), default=None),
            "kept": train_summary.get("num_prompts", 0) - train_summary.get("num_filtered", 0)
            if train_summary else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--port", type=int, default=7872)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--spec", default="{}", help="JSON merged into each launched spec (tuning)")
    args = parser.parse_args()

    from benchmarks.harness import studio

    with studio(args.data_dir, port=args.port, env=OFFLINE) as app:
        client = Client(app.url, verbose=False)
        results = []
        for seed in args.seeds:
            result = run_seed(client, seed, json.loads(args.spec))
            results.append(result)
            print(json.dumps(result), flush=True)
        gains = [r["accuracy_after"] - r["accuracy_before"] for r in results if r["accuracy_after"] is not None]
        print(json.dumps({"min_gain_points": round(100 * min(gains), 1) if gains else None,
                          "max_wall_s": max(r["wall_s"] for r in results)}), flush=True)


if __name__ == "__main__":
    main()
