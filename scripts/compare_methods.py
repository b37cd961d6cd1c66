"""A*-PO against GRPO on the teaching demo, from the dashboard: for each run seed, "A*-PO vs GRPO" (`/launch_pair`,
the Launch page's button) with the teaching-demo preset (SmolLM2-135M-Instruct, 2-digit sums, N = G = 8, GRPO's batch
8 x 8 completions: the same 8 prompts per step), both runs to the end, then each run's held-out accuracy against
wall time, its final accuracy, the time A*-PO needs to reach GRPO's final accuracy (with its stage 1 and without),
and peak memory, as the Compare page computes them (`app.web.comparison`).

    python scripts/compare_methods.py DATA_DIR [--seeds 0 1 2] [--port 7873] [--spec '{"config": {...}}']
    python scripts/compare_methods.py DATA_DIR --report [--seeds 0 1 2]    # the figures of pairs already run
    python scripts/compare_methods.py DATA_DIR --follow-ups --seeds 0        # two runs that explain seed 0's pair

`--follow-ups` launches, through `/launch`, two runs beside a finished pair: GRPO's run up to its first evaluation
after the start, evaluated every 2 steps (where it passes A*-PO's final accuracy; with a constant learning rate its
steps are the pair's), and A*-PO with `filter_all_incorrect` off (stage 2 over every prompt: as many steps as GRPO).

Starts `python -m app` on DATA_DIR once. The scheduler runs one run at a time on a CPU (a run takes the machine),
so the two runs of a pair do not share the cores; nothing else should use the CPU meanwhile. Prints one JSON line
per run, one verdict line per seed, and a Markdown table of the seeds with their medians. Each seed's pair shares
nothing: a seed is part of V*'s settings, so every A*-PO run samples its own stage 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FINISHED = ("finished", "failed", "stopped", "interrupted")


def wait_finished(client, run_id: int) -> dict:
    while True:
        status = client.predict(run_id=run_id, api_name="/status")
        if status["status"] in FINISHED:
            return status
        time.sleep(2.0)


def launch_pairs(data_dir: Path, seeds: list[int], port: int, extra: dict) -> None:
    """Press "A*-PO vs GRPO" once per seed on a studio serving `data_dir`, and wait for every run to end."""
    def work(client) -> None:
        for seed in seeds:
            spec = {"name": f"duel-seed{seed}", **extra, "config": {**extra.get("config", {}), "seed": seed}}
            pair = client.predict(spec=spec, api_name="/launch_pair")
            for method in ("a2po", "grpo"):
                status = wait_finished(client, pair[method]["run_id"])
                print(f"seed {seed} {method}: run {pair[method]['run_id']} {status['status']}", flush=True)

    with_studio(data_dir, port, work)


def wait_runs(client, run_ids: list[int]) -> None:
    for run_id in run_ids:
        print(f"run {run_id}: {wait_finished(client, run_id)['status']}", flush=True)


def with_studio(data_dir: Path, port: int, work) -> None:
    """Run `work(client)` against `python -m app` serving `data_dir` on `port`."""
    from gradio_client import Client
    from studio_client import wait_for_port

    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(ROOT))
    app = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--data-dir", str(data_dir)],
                           cwd=ROOT, env=env)
    try:
        wait_for_port(port)
        work(Client(f"http://127.0.0.1:{port}/", verbose=False))
    finally:
        app.terminate()
        app.wait(timeout=60)


def follow_up_specs(store, seed: int) -> list[dict]:
    """GRPO's first stretch evaluated every 2 steps, and A*-PO over every prompt, from seed `seed`'s stored pair."""
    import copy

    runs = {r["name"]: r for r in sorted(store.list_runs(), key=lambda r: r["id"])}
    a2po, grpo = (runs.get(f"duel-seed{seed}-{m}") for m in ("a2po", "grpo"))
    if a2po is None or grpo is None:
        raise SystemExit(f"No pair of seed {seed} in this data folder: run it first (without --follow-ups).")
    steps = [e["step"] for e in store.get_evaluations(grpo["id"]) if e.get("split", "eval") == "eval"]
    early = copy.deepcopy(grpo["config"])
    early["name"] = f"duel-seed{seed}-grpo-early"
    early["config"].update(max_steps=sorted(steps)[1], eval_steps=2)
    every = copy.deepcopy(a2po["config"])
    every["name"] = f"duel-seed{seed}-a2po-every-prompt"
    every["config"]["filter_all_incorrect"] = False
    return [early, every]


def report_follow_ups(store, seed: int) -> None:
    from app.web import comparison
    from app.web.common import format_duration as duration

    pair = stored_pair(store, seed)
    for run in sorted(store.list_runs(), key=lambda r: r["id"]):
        if run["name"] not in (f"duel-seed{seed}-grpo-early", f"duel-seed{seed}-a2po-every-prompt"):
            continue
        line = comparison.store_timeline(store, run)
        print(json.dumps({"name": run["name"], "run_id": run["id"], "status": run["status"],
                          "stage1_s": round(line.stage1_seconds, 1), "peak_memory_gb": line.peak_memory_gb,
                          "curve": [(p.step, round(p.seconds, 1), p.tokens, p.accuracy) for p in line.points]}),
              flush=True)
        if run["name"].endswith("grpo-early") and "a2po" in pair and line.status == "finished":
            a2po = pair["a2po"]
            target, mine = a2po.final_accuracy, a2po.first_reaching(a2po.final_accuracy)
            there = line.first_reaching(target)
            print(f"seed {seed}: A*-PO first reached its final {100 * target:.1f}% at step {mine.step}, "
                  f"{duration(mine.seconds + a2po.stage1_seconds)} ({duration(mine.seconds)} without stage 1); GRPO "
                  + ("did not reach it in its first stretch" if there is None else
                     f"at step {there.step}, {duration(there.seconds)}") + ".", flush=True)


def stored_pair(store, seed: int) -> dict:
    """The newest runs named as `launch_pairs` names seed `seed`'s pair, by method."""
    from app.web import comparison

    runs = {}
    for run in sorted(store.list_runs(), key=lambda r: r["id"]):
        for method in ("a2po", "grpo"):
            if run["name"] == f"duel-seed{seed}-{method}":
                runs[method] = comparison.store_timeline(store, run)
    return runs


def report(store, seeds: list[int]) -> None:
    from app.web import comparison
    from app.web.common import format_duration as duration

    rows = []
    for seed in seeds:
        pair = stored_pair(store, seed)
        if set(pair) != {"a2po", "grpo"}:
            print(f"seed {seed}: no finished pair in this data folder", flush=True)
            continue
        a2po, grpo = pair["a2po"], pair["grpo"]
        if a2po.status != "finished" or grpo.status != "finished" or not a2po.points or not grpo.points:
            print(f"seed {seed}: A*-PO {a2po.status}, GRPO {grpo.status}: left out until both have finished "
                  "with held-out points", flush=True)
            continue
        for method, line in pair.items():
            print(json.dumps({
                "seed": seed, "method": method, "run_id": line.run_id, "status": line.status,
                "final_accuracy": line.final_accuracy, "stage1_s": round(line.stage1_seconds, 1),
                "stage1_tokens": line.stage1_tokens, "peak_memory_gb": line.peak_memory_gb,
                "curve": [(p.step, round(p.seconds, 1), p.tokens, p.accuracy) for p in line.points]}), flush=True)
        print(f"seed {seed}: {comparison.verdict(a2po, grpo)}", flush=True)
        to_grpo = a2po.first_reaching(grpo.final_accuracy)
        to_a2po = grpo.first_reaching(a2po.final_accuracy)
        rows.append({
            "seed": seed, "a2po_start": a2po.points[0].accuracy, "a2po_final": a2po.final_accuracy,
            "a2po_s": a2po.points[-1].seconds + a2po.stage1_seconds, "a2po_stage2_s": a2po.points[-1].seconds,
            "grpo_start": grpo.points[0].accuracy, "grpo_final": grpo.final_accuracy, "grpo_s": grpo.points[-1].seconds,
            "a2po_to_grpo_final_s": None if to_grpo is None else to_grpo.seconds + a2po.stage1_seconds,
            "grpo_to_a2po_final_s": None if to_a2po is None else to_a2po.seconds,
            "a2po_tokens": a2po.points[-1].tokens + a2po.stage1_tokens, "grpo_tokens": grpo.points[-1].tokens,
            "a2po_rss": a2po.peak_memory_gb, "grpo_rss": grpo.peak_memory_gb})
    if not rows:
        return
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    gib = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    when = lambda v: "not reached" if v is None else duration(v)  # noqa: E731
    print("\n| seed | A*-PO acc. start → end | A*-PO time (stage 2 alone) | GRPO acc. start → end | GRPO time "
          "| A*-PO at GRPO's end acc. | GRPO past A*-PO's end acc. by | tokens A*-PO / GRPO "
          "| peak RSS GB A*-PO / GRPO |")
    print("| --- " * 9 + "|")
    for r in rows:
        print(f"| {r['seed']} | {pct(r['a2po_start'])} → {pct(r['a2po_final'])} | {duration(r['a2po_s'])} "
              f"({duration(r['a2po_stage2_s'])}) | {pct(r['grpo_start'])} → {pct(r['grpo_final'])} "
              f"| {duration(r['grpo_s'])} | {when(r['a2po_to_grpo_final_s'])} | {when(r['grpo_to_a2po_final_s'])} "
              f"| {r['a2po_tokens']:,} / {r['grpo_tokens']:,} | {gib(r['a2po_rss'])} / {gib(r['grpo_rss'])} |")
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    print(f"\nmedians over {len(rows)} seeds: A*-PO {pct(med('a2po_final'))} in {duration(med('a2po_s'))} "
          f"({duration(med('a2po_stage2_s'))} without stage 1); GRPO {pct(med('grpo_final'))} in "
          f"{duration(med('grpo_s'))}; A*-PO's whole run / GRPO's: {med('a2po_s') / med('grpo_s'):.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--port", type=int, default=7873)
    parser.add_argument("--spec", default="{}", help="JSON merged into each pair's A*-PO spec (the teaching demo's)")
    parser.add_argument("--report", action="store_true", help="only report the pairs already in DATA_DIR")
    parser.add_argument("--follow-ups", action="store_true", help="launch the two follow-up runs of each seed")
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from storage import Store

    store = Store(options.data_dir / "studio.db")
    if options.follow_ups:
        specs = [spec for seed in options.seeds for spec in follow_up_specs(store, seed)]
        with_studio(options.data_dir, options.port, lambda client: wait_runs(
            client, [client.predict(spec=spec, api_name="/launch")["run_id"] for spec in specs]))
    elif not options.report:
        launch_pairs(options.data_dir, options.seeds, options.port, json.loads(options.spec))
    report(store, options.seeds)
    for seed in options.seeds:
        report_follow_ups(store, seed)


if __name__ == "__main__":
    main()
