"""The teaching presets as a visitor runs them: press Train (a `/launch` of the preset: the form's defaults) with run
seed 0, 1, 2 in turn, and time each from the click to "finished", with held-out accuracy before and after; the
command that measures every preset's learning again.

    python scripts/teaching_demo.py DATA_DIR                                  # the teaching demo, seeds 0 1 2
    python scripts/teaching_demo.py DATA_DIR --presets teaching-demo teaching-demo-lora --runner chunked
    python scripts/teaching_demo.py DATA_DIR --presets teaching-demo-lora --learning-rates 2e-4 5e-4 1e-3
    python scripts/teaching_demo.py DATA_DIR --report                         # the table of what DATA_DIR ran

`--runner chunked` runs each as a ZeroGPU Space's visitor gets it: a series of short chunks that each restore the
run and save what it trains (`app.runtime.chunks`). `--learning-rates` tries each preset at those rates (each still
over every seed). Starts `python -m app` on DATA_DIR once and runs one run at a time (as the scheduler would
anyway); a run already finished in DATA_DIR under its name is not run again, so an interrupted measurement continues
by running the same command. A fresh DATA_DIR includes the one-time conversion of the default model in the first
run. Prints one JSON line per run, then a markdown table: per preset and learning rate, the median and range over
seeds of the held-out accuracy at the end and of the click-to-finished time; `--results FILE` keeps them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gradio_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed

OFFLINE = {"HF_HUB_OFFLINE": "1"}
ENDED = ("finished", "failed", "stopped", "interrupted")


def accuracy_points(client: Client, run_id: int) -> list[tuple[int, float]]:
    rows = client.predict(run_id=run_id, after_id=0, api_name="/metrics")
    return sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval_accuracy")


def run_name(preset: str, learning_rate: float | None, seed: int) -> str:
    return f"{preset}{'' if learning_rate is None else f'-lr{learning_rate:g}'}-seed{seed}"


def measure(client: Client, run_id: int, started: float | None) -> dict[str, Any]:
    status = client.predict(run_id=run_id, api_name="/status")
    points = accuracy_points(client, run_id)
    values = (status.get("values") or {}).get("summary") or {}
    train_summary = values.get("train", values) if isinstance(values, dict) else {}
    return {"run_id": run_id, "status": status["status"], "error": status.get("error"),
            "wall_s": None if started is None else round(time.time() - started, 1),
            "accuracy_before": points[0][1] if points else None,
            "accuracy_after": points[-1][1] if points else None, "eval_points": points,
            "steps": max((s for s, _ in points), default=None),
            "kept": train_summary.get("num_prompts", 0) - train_summary.get("num_filtered", 0)
            if train_summary else None}


def run_one(client: Client, spec: dict[str, Any]) -> dict[str, Any]:
    """Press Train with `spec` and wait for the run's end: its figures, timed from the click."""
    start = time.time()
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    while client.predict(run_id=run_id, api_name="/status")["status"] not in ENDED:
        time.sleep(1.0)
    return measure(client, run_id, start)


def earlier(client: Client, name: str) -> dict[str, Any] | None:
    """The newest finished run named `name` in the studio, measured (its wall time from its own record), or None."""
    runs = [r for r in client.predict(api_name="/list_runs") if r["name"] == name and r["status"] == "finished"]
    if not runs:
        return None
    run = max(runs, key=lambda r: r["id"])
    found = measure(client, run["id"], None)
    status = client.predict(run_id=run["id"], api_name="/status")
    if status.get("created_at") and status.get("finished_at"):
        found["wall_s"] = round(status["finished_at"] - status["created_at"], 1)
    return found


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: per preset and learning rate, the medians and ranges over seeds."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["preset"], "preset's" if r["learning_rate"] is None else f"{r['learning_rate']:g}"),
                          []).append(r)
    lines = ["| preset | learning rate | seeds | held-out accuracy at the end, median (range) | before | "
             "click to finished, median (range) |", "| --- | --- | --- | --- | --- | --- |"]
    for (preset, rate), rows in groups.items():
        done = [r for r in rows if r["status"] == "finished" and r["accuracy_after"] is not None]
        after = [r["accuracy_after"] for r in done]
        walls = [r["wall_s"] for r in done if r["wall_s"] is not None]
        before = statistics.median(r["accuracy_before"] for r in done) if done else None

        def span(values: list[float], fmt) -> str:
            return (f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})" if values else "–")

        lines.append(f"| {preset} | {rate} | {', '.join(str(r['seed']) for r in rows)} | "
                     f"{span(after, lambda v: f'{100 * v:.1f}%')} | "
                     f"{'–' if before is None else f'{100 * before:.1f}%'} | "
                     f"{span(walls, lambda s: f'{int(s // 60)}m {int(s % 60):02d}s')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--port", type=int, default=7872)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--presets", nargs="+", default=["teaching-demo"], help="the presets to measure")
    parser.add_argument("--runner", choices=["worker", "chunked"], default="worker",
                        help="chunked: as a ZeroGPU Space's visitor gets a run (short chunks)")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=None,
                        help="try each preset at these learning rates (default: the preset's own)")
    parser.add_argument("--spec", default="{}", help="JSON merged into each launched spec (tuning)")
    parser.add_argument("--results", type=Path, default=None, help="write every run's figures here as JSON")
    parser.add_argument("--report", action="store_true", help="only the table of the runs DATA_DIR finished")
    args = parser.parse_args()

    from a2po.presets import PRESETS
    from benchmarks.harness import studio

    if unknown := [p for p in args.presets if p not in PRESETS]:
        parser.error(f"--presets: unknown {', '.join(unknown)}; the presets are {', '.join(PRESETS)}.")
    extra = json.loads(args.spec)
    results = []
    with studio(args.data_dir, port=args.port, env=OFFLINE) as app:
        client = Client(app.url, verbose=False)
        for preset in args.presets:
            for rate in args.learning_rates or [None]:
                for seed in args.seeds:
                    name = run_name(preset, rate, seed)
                    config = {**extra.get("config", {}), "seed": seed, **({} if rate is None else
                                                                            {"learning_rate": rate})}
                    spec = {**extra, "preset": preset, "name": name, "runner": args.runner, "config": config}
                    found = earlier(client, name)
                    if found is None and args.report:
                        continue
                    result = {"preset": preset, "learning_rate": rate, "seed": seed, "runner": args.runner,
                              **(found if found is not None else run_one(client, spec))}
                    results.append(result)
                    print(json.dumps(result), flush=True)
                    if args.results is not None:
                        args.results.write_text(json.dumps(results, indent=1))
    print("\n" + table(results), flush=True)


if __name__ == "__main__":
    main()
