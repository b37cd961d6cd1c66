"""A*-PO against GRPO on the teaching demo, from the dashboard: "A*-PO vs GRPO" (`/launch_pair`, the Launch page's
button) with the paper's protocol (both over every prompt, the same prompts per step and the same steps, G = N = 8,
one grid of held-out evaluations) for run seeds 0, 1, 2 as one study, every run to its end, then what the Compare
page shows of it (`app.studies.comparison`): each run's held-out accuracy against training time and completion
tokens, final accuracies, training time with stage 1 and without, tokens, peak memory, the medians, and the median
time A*-PO needs to reach GRPO's final accuracy less 3 points and GRPO's to reach A*-PO's final accuracy.

    python scripts/compare_methods.py DATA_DIR [--seeds 0 1 2] [--protocol paper] [--spec '{"dataset": {...}}']
    python scripts/compare_methods.py DATA_DIR --protocol time --budget-minutes 3 --name equal-time
    python scripts/compare_methods.py DATA_DIR --grpo-recipe dr-grpo --name duel-dr-grpo   # GRPO as Dr. GRPO
    python scripts/compare_methods.py DATA_DIR --report [--name duel]    # the figures of the newest study run

Starts `python -m app` on DATA_DIR. The scheduler runs one run at a time on a CPU (a run takes the machine), so runs
do not share the cores; nothing else should use the CPU meanwhile. The runs are stored: `--report` reads a study that
ran (or is still running) in an earlier session. Holds out 128 prompts unless `--spec` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed
FINISHED = ("finished", "failed", "stopped", "interrupted")
MARGIN = 0.03  # "reaches GRPO's final accuracy" means within 3 points of it (one evaluation's noise is larger)


def wait_finished(client, run_id: int) -> dict:
    while True:
        status = client.predict(run_id=run_id, api_name="/status")
        if status["status"] in FINISHED:
            return status
        time.sleep(5.0)


def launch_study(data_dir: Path, port: int, name: str, seeds: list[int], protocol: str, extra: dict,
                 budget_minutes: float = 0.0, grpo_recipe: str = "") -> None:
    """Press "A*-PO vs GRPO" with `seeds` (its GRPO side under `grpo_recipe`) on a studio serving `data_dir`, and
    wait for every run to end."""
    from gradio_client import Client

    from benchmarks.harness import studio

    with studio(data_dir, port=port) as app:
        client = Client(app.url, verbose=False)
        spec = {"name": name, **extra, "dataset": {"eval_size": 128, **extra.get("dataset", {})}}
        study = client.predict(spec=spec, protocol=protocol, budget_minutes=budget_minutes, seeds=seeds,
                               grpo_recipe=grpo_recipe, api_name="/launch_pair")
        print(f"study {study['study']}: " + ", ".join(f"{m} #{p[m]['run_id']}" for p in study["pairs"]
                                                      for m in ("a2po", "grpo")), flush=True)
        for pair in study["pairs"]:
            for method in ("a2po", "grpo"):
                status = wait_finished(client, pair[method]["run_id"])
                print(f"{pair[method]['name']}: run {pair[method]['run_id']} {status['status']}", flush=True)


def newest_study(store, name: str) -> list[dict]:
    """The runs of the newest study named `name`, by id."""
    runs = [r for r in store.list_runs() if ((r.get("config") or {}).get("study") or {}).get("name") == name]
    if not runs:
        raise SystemExit(f"No study named {name!r} in this data folder: run it first (without --report).")
    newest = max(runs, key=lambda r: r["id"])["config"]["study"]["id"]
    return sorted((r for r in runs if r["config"]["study"]["id"] == newest), key=lambda r: r["id"])


def report(store, name: str) -> None:
    from app.studies import comparison
    from app.studies.comparison import format_duration as duration

    runs = newest_study(store, name)
    timelines = [comparison.store_timeline(store, r) for r in runs]
    view = comparison.study_view(runs, timelines)
    tag = runs[0]["config"]["study"]
    print(f"study {tag['id']} ({tag.get('protocol')} protocol, {tag.get('seeds')} seeds): "
          + ", ".join(f"#{t.run_id} {t.status}" for t in timelines), flush=True)
    for run, line in zip(runs, timelines, strict=True):
        print(json.dumps({"run_id": line.run_id, "name": line.name, "method": line.method,
                          "seed": comparison.run_seed(run), "status": line.status,
                          "stage1_s": round(line.stage1_seconds, 1), "stage1_tokens": line.stage1_tokens,
                          "peak_memory_gb": line.peak_memory_gb,
                          "curve": [(p.step, round(p.seconds, 1), p.tokens, p.accuracy) for p in line.points]}),
              flush=True)
    seeds: dict[int, dict[str, comparison.Timeline]] = {}
    for run, line in zip(runs, timelines, strict=True):
        seeds.setdefault(comparison.run_seed(run), {})[line.method] = line
    rows = []
    for seed, pair in sorted(seeds.items()):
        a2po, grpo = pair.get("a2po"), pair.get("grpo")
        if a2po is None or grpo is None or not a2po.points or not grpo.points:
            continue
        print(f"seed {seed}: {comparison.verdict(a2po, grpo, margin=MARGIN)}", flush=True)
        to_grpo = a2po.first_reaching(grpo.final_accuracy - MARGIN)
        to_grpo_g = grpo.first_reaching(grpo.final_accuracy - MARGIN)
        to_a2po = grpo.first_reaching(a2po.final_accuracy)
        rows.append({"seed": seed, "done": a2po.status == grpo.status == "finished",
                     "a2po_final": a2po.final_accuracy, "grpo_final": grpo.final_accuracy,
                     "a2po_s": a2po.seconds_with_stage1, "a2po_stage2_s": a2po.points[-1].seconds,
                     "grpo_s": grpo.points[-1].seconds,
                     "a2po_to_grpo": None if to_grpo is None else to_grpo.seconds + a2po.stage1_seconds,
                     "grpo_to_own": to_grpo_g.seconds, "grpo_to_a2po": None if to_a2po is None else to_a2po.seconds,
                     "a2po_tokens": a2po.points[-1].tokens + a2po.stage1_tokens, "grpo_tokens": grpo.points[-1].tokens,
                     "a2po_rss": a2po.peak_memory_gb, "grpo_rss": grpo.peak_memory_gb,
                     "equal_steps": _at_equal_steps(a2po, grpo),
                     "grpo_at_a2po_time": _accuracy_by(grpo, a2po.seconds_with_stage1)})
    if not rows:
        return
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    gib = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    when = lambda v: "not reached" if v is None else duration(v)  # noqa: E731
    print("\n| seed | A*-PO final | GRPO final | A*-PO time (stage 2 alone) | GRPO time | A*-PO to GRPO's final - 3 "
          "| GRPO to its final - 3 | GRPO to A*-PO's final | GRPO by A*-PO's time | tokens A*-PO / GRPO "
          "| peak RSS GB A*-PO / GRPO |")
    print("| --- " * 11 + "|")
    for r in rows:
        print(f"| {r['seed']}{'' if r['done'] else ' (unfinished)'} | {pct(r['a2po_final'])} | {pct(r['grpo_final'])} "
              f"| {duration(r['a2po_s'])} ({duration(r['a2po_stage2_s'])}) | {duration(r['grpo_s'])} "
              f"| {when(r['a2po_to_grpo'])} | {duration(r['grpo_to_own'])} | {when(r['grpo_to_a2po'])} "
              f"| {pct(r['grpo_at_a2po_time'])} | {r['a2po_tokens']:,} / {r['grpo_tokens']:,} "
              f"| {gib(r['a2po_rss'])} / {gib(r['grpo_rss'])} |")
    done = [r for r in rows if r["done"]]  # an unfinished seed's latest point is not its end: in the table only
    if not done:
        return
    med = lambda key: statistics.median(r[key] for r in done)  # noqa: E731
    reached = [r["a2po_to_grpo"] for r in done if r["a2po_to_grpo"] is not None]
    print(f"\nmedians over the {len(done)} of {len(rows)} seeds that finished: A*-PO {pct(med('a2po_final'))} in "
          f"{duration(med('a2po_s'))} ({duration(med('a2po_stage2_s'))} without stage 1); GRPO "
          f"{pct(med('grpo_final'))} in {duration(med('grpo_s'))}; A*-PO reached GRPO's final less 3 points in "
          + (f"{duration(statistics.median(reached))} with its stage 1 ({len(reached)} of {len(done)} seeds): "
             f"{statistics.median(reached) / med('grpo_to_own'):.2f}x the {duration(med('grpo_to_own'))} GRPO took "
             f"to reach the same accuracy, {statistics.median(reached) / med('grpo_s'):.2f}x GRPO's whole training "
             f"time" if reached else "no seed") + "; at equal steps, A*-PO minus GRPO (median over the grid's points "
          f"and seeds): {100 * statistics.median(d for r in done for d in r['equal_steps']):+.1f} points; at A*-PO's "
          f"whole time with its stage 1, GRPO was at {pct(med('grpo_at_a2po_time'))} (its last evaluation by then) "
          f"against A*-PO's {pct(med('a2po_final'))}", flush=True)
    ratios = [r["a2po_to_grpo"] / r["grpo_s"] for r in rows if r["a2po_to_grpo"] is not None]
    if ratios:
        print("per seed, A*-PO's time to GRPO's final less 3 points over GRPO's whole training time: "
              + ", ".join(f"{v:.2f}x" for v in ratios), flush=True)
    if view.medians:
        a2po, grpo = view.pair()
        print(f"\nverdict on the medians: {comparison.verdict(a2po, grpo, margin=MARGIN)}", flush=True)


def _accuracy_by(line, seconds: float) -> float:
    """A run's held-out accuracy at its last evaluation at or before `seconds` of its own training time."""
    return max((p for p in line.points if p.seconds <= seconds), key=lambda p: p.seconds).accuracy


def _at_equal_steps(a2po, grpo) -> list[float]:
    """A*-PO's accuracy minus GRPO's at each step both were evaluated at (the step-0 point left out)."""
    theirs = {p.step: p.accuracy for p in grpo.points}
    return [p.accuracy - theirs[p.step] for p in a2po.points if p.step and p.step in theirs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--name", default="duel")
    parser.add_argument("--protocol", default="paper", choices=("paper", "trl", "time"))
    parser.add_argument("--budget-minutes", type=float, default=0.0,
                        help="each run's training time under --protocol time (A*-PO's stage 1 included)")
    parser.add_argument("--grpo-recipe", default="",
                        help="the GRPO side's named recipe (dapo, dr-grpo, ...: a2po/recipes.py); none: TRL's defaults")
    parser.add_argument("--port", type=int, default=7873)
    parser.add_argument("--spec", default="{}", help="JSON merged into the pair's A*-PO spec (the teaching demo's)")
    parser.add_argument("--report", action="store_true", help="only report the newest study already in DATA_DIR")
    options = parser.parse_args()

    from storage import Store

    if options.grpo_recipe:
        from a2po.recipes import RecipeError, canonical_name

        try:  # refused before a studio starts
            options.grpo_recipe = canonical_name(options.grpo_recipe)
        except RecipeError as error:
            parser.error(f"--grpo-recipe: {error}")
    if not options.report:
        launch_study(options.data_dir, options.port, options.name, options.seeds, options.protocol,
                     json.loads(options.spec), options.budget_minutes, options.grpo_recipe)
    report(Store(options.data_dir / "studio.db"), options.name)


if __name__ == "__main__":
    main()
