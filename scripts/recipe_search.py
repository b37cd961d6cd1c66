"""Issue 39's recipe search: each method's best settings at equal training time (stage 1 counted), from the studio's
own sweeps, then the duel "A*-PO vs GRPO" with each method at its best point.

    python scripts/recipe_search.py DATA_DIR --dry-run          # the runs it would launch and their training time
    python scripts/recipe_search.py DATA_DIR                    # the search, then its table
    python scripts/recipe_search.py DATA_DIR --report           # the table of a search that ran (or still runs)
    python scripts/recipe_search.py DATA_DIR --duel             # the duel at each method's best, 4 and 8 minutes
    python scripts/recipe_search.py DATA_DIR --task basic-arithmetic --a2po-batch 8 32 --lrs 1e-5 --minutes 4

The grid, every point at `--minutes` of training time per run (`max_train_seconds`, A*-PO's stage 1 inside it),
held-out accuracy on 128 prompts every 1/8 of the budget, for each run seed (`--seeds`, 3 by default):

    A*-PO   prompts per step (`--a2po-batch`) x learning rate (`--lrs`) x selection (`--selections`): every prompt;
            p > 0 (`filter_all_incorrect`, TRL's name); the pass-rate band [0.25, 0.75] (`pass_rate_band`)
    GRPO    recipe (`--recipes`, `a2po.recipes`) x learning rate x prompts per step (`--grpo-batch`; G = 8
            completions each, so its per_device_train_batch_size is 8 x that)

One studio sweep (`/launch_study`) per selection and per recipe, so no study passes the studio's 64 runs; the A*-PO
sweeps share one V* set, each run charged what sampling it cost. The report gives, per grid point, the median and
range over seeds of the final held-out accuracy, training time, completion tokens and peak memory, marks diverged
runs (a NaN loss, or a final accuracy below the step-0 one), and picks each method's best point by its median over
seeds, among the points whose every seed finished without a NaN loss. `--duel` then presses "A*-PO vs GRPO"
(`/launch_pair`, protocol "time", `grpo_recipe` and `grpo_settings`) at those points, for each of `--minutes`
(4 and 8 by default), and prints the verdicts as markdown for docs/benchmarks.md.

Starts `python -m app` on DATA_DIR (benchmarks/harness.py); the scheduler runs one run at a time on a CPU, so nothing
else should use it meanwhile. A study already in DATA_DIR under its name is waited for, not launched again: an
interrupted search continues by running the same command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed
FINISHED = ("finished", "failed", "stopped", "interrupted")
MARGIN = 0.03  # as scripts/compare_methods.py: "reaches" means within 3 points
GENERATIONS = 8  # GRPO's G, the teaching demo's N
EVAL_SIZE = 128
SELECTIONS = {"every": {"filter_all_incorrect": False, "pass_rate_band": None},
              "solved": {"filter_all_incorrect": True, "pass_rate_band": None},
              "band": {"filter_all_incorrect": False, "pass_rate_band": [0.25, 0.75]}}
SELECTION_LABELS = {"every": "every prompt", "solved": "p > 0", "band": "p in [0.25, 0.75]"}
# docs/benchmarks.md, "A reasoning-gym task with SmolLM2 on this CPU": the task SmolLM2 learns on this CPU.
TASKS = {
    "teaching-demo": {},
    "basic-arithmetic": {"source": "reasoning-gym", "task": "basic_arithmetic", "answer_format": "number",
                         "settings": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                      "operators": ["+"], "allow_negation": False},
                         "system_prompt": "", "num_prompts": 256, "seed": 0},
}


@dataclass(frozen=True)
class Sweep:
    """One studio sweep of the search: a method at one selection (A*-PO) or one recipe (GRPO)."""

    name: str
    method: str
    label: str  # the selection's or the recipe's name
    spec: dict[str, Any]
    grid: dict[str, list[Any]]


def budget(minutes: float) -> dict[str, Any]:
    """The config of a run that trains for `minutes` (stage 1 counted), evaluated every 1/8 of it: what the
    equal-time protocol sets (`app.studies.protocols.pair_specs`)."""
    from app.studies.protocols import EVAL_POINTS, TIME_EPOCHS

    seconds = 60.0 * minutes
    return {"max_train_seconds": seconds, "eval_every_seconds": seconds / EVAL_POINTS, "eval_steps": None,
            "max_steps": -1, "num_train_epochs": TIME_EPOCHS}


def base_spec(options: argparse.Namespace, name: str, method: str) -> dict[str, Any]:
    extra = json.loads(options.spec)
    spec = {**extra, "name": name, "dataset": {**TASKS[options.task], "eval_size": EVAL_SIZE,
                                               **extra.get("dataset", {})}}
    spec["config"] = {**extra.get("config", {}), **budget(options.minutes[0])}
    if method == "grpo":  # the A*-PO settings of --spec (N, beta1, ...) go to the A*-PO runs only
        from a2po.runspec import METHOD_CONFIG_FIELDS

        spec["method"] = "grpo"
        spec["config"] = {k: v for k, v in spec["config"].items() if k in METHOD_CONFIG_FIELDS["grpo"]}
        spec["config"]["num_generations"] = GENERATIONS
    return spec


def plan(options: argparse.Namespace) -> list[Sweep]:
    sweeps = []
    for selection in options.selections:
        spec = base_spec(options, f"{options.name}-a2po-{selection}", "a2po")
        spec["config"].update(SELECTIONS[selection])
        sweeps.append(Sweep(spec["name"], "a2po", selection, spec,
                            {"per_device_train_batch_size": options.a2po_batch, "learning_rate": options.lrs}))
    for recipe in options.recipes:
        spec = base_spec(options, f"{options.name}-grpo-{recipe}", "grpo")
        spec["recipe"] = recipe
        sweeps.append(Sweep(spec["name"], "grpo", recipe, spec,
                            {"per_device_train_batch_size": [GENERATIONS * p for p in options.grpo_batch],
                             "learning_rate": options.lrs}))
    return sweeps


def dry_run(options: argparse.Namespace, sweeps: list[Sweep]) -> None:
    """Print every run the search would launch (the studio's own sweep specs) and the training time, start nothing."""
    from a2po.runspec import RunSpec, with_defaults
    from app.studies.sweeps import sweep_specs

    total = 0
    for sweep in sweeps:
        runs = sweep_specs(with_defaults(sweep.spec), sweep.grid, options.seeds)
        print(f"study {sweep.name}: {len(runs)} runs", flush=True)
        for run in runs:
            RunSpec.from_dict(run)  # the library's checks of each run: a bad flag stops here, not in the studio
            print(f"  {run['name']}", flush=True)
        total += len(runs)
    minutes = options.minutes[0]
    print(f"\nwould launch {total} runs in {len(sweeps)} studies, {minutes:g} min of training each: "
          f"{total * minutes / 60:.1f} h of training one run after another, plus each run's model loading and its "
          f"held-out evaluations ({EVAL_SIZE} prompts, 9 of them), which a finished run's wall time in the studio "
          "shows.", flush=True)
    budgets = [4.0, 8.0]
    duels = len(options.seeds) * 2 * sum(budgets)
    print(f"then --duel: {len(options.seeds)} seed(s) x 2 methods at {' and '.join(f'{m:g}' for m in budgets)} min: "
          f"{duels / 60:.1f} h of training more.", flush=True)


def studies_named(store: Any, name: str) -> list[dict[str, Any]]:
    """The runs of the newest study named `name`, by id ([] if none)."""
    runs = [r for r in store.list_runs() if ((r.get("config") or {}).get("study") or {}).get("name") == name]
    if not runs:
        return []
    newest = max(runs, key=lambda r: r["id"])["config"]["study"]["id"]
    return sorted((r for r in runs if r["config"]["study"]["id"] == newest), key=lambda r: r["id"])


def wait_finished(client: Any, run_ids: list[int]) -> None:
    for run_id in run_ids:
        while (status := client.predict(run_id=run_id, api_name="/status"))["status"] not in FINISHED:
            time.sleep(5.0)
        print(f"run {run_id} ({status['name']}): {status['status']}", flush=True)


def serve(options: argparse.Namespace, launch: Any) -> None:
    """A studio on DATA_DIR, `launch(client, store)` returning the run ids to wait for, then waiting for them."""
    from gradio_client import Client

    from benchmarks.harness import studio
    from storage import Store

    args = ["--model-root", options.model_root] if options.model_root else []
    with studio(options.data_dir, *args, port=options.port) as app:
        client = Client(app.url, verbose=False)
        wait_finished(client, launch(client, Store(options.data_dir / "studio.db")))


def search(options: argparse.Namespace, sweeps: list[Sweep]) -> None:
    def launch(client: Any, store: Any) -> list[int]:
        ids = []
        for sweep in sweeps:
            if earlier := studies_named(store, sweep.name):
                print(f"study {sweep.name}: in {options.data_dir} already ({len(earlier)} runs)", flush=True)
                ids += [r["id"] for r in earlier]
                continue
            made = client.predict(spec=sweep.spec, grid=sweep.grid, seeds=options.seeds, api_name="/launch_study")
            print(f"study {sweep.name} ({made['study']}): {len(made['runs'])} runs", flush=True)
            ids += [r["run_id"] for r in made["runs"]]
        return ids

    serve(options, launch)


# ----------------------------------------------------------------------------------------------------------------
# Reading the search back


@dataclass
class Seed:
    run_id: int
    status: str
    final: float | None
    seconds: float | None
    tokens: int | None
    peak_gb: float | None
    nan_loss: bool
    fell: bool  # the final held-out accuracy below the step-0 one

    @property
    def diverged(self) -> bool:
        return self.nan_loss or self.fell


@dataclass
class GridPoint:
    method: str
    label: str  # selection or recipe
    prompts: int  # prompts per optimizer step
    learning_rate: float
    settings: dict[str, Any]  # the config settings that make the point (for the duel)
    seeds: list[Seed]

    def median(self, key: str) -> float | None:
        values = [getattr(s, key) for s in self.seeds if s.status == "finished" and getattr(s, key) is not None]
        return statistics.median(values) if values else None

    @property
    def eligible(self) -> bool:
        return bool(self.seeds) and all(s.status == "finished" and s.final is not None and not s.nan_loss
                                        for s in self.seeds)


def read_seed(store: Any, run: dict[str, Any]) -> Seed:
    from app.studies.comparison import store_timeline

    line = store_timeline(store, run)
    nan_loss = any(m["value"] is None for m in store.get_metrics(run["id"], names=["loss"]))
    last = line.points[-1] if line.points else None
    return Seed(run["id"], run["status"], line.final_accuracy, line.seconds_with_stage1,
                None if last is None else last.tokens + line.stage1_tokens, line.peak_memory_gb, nan_loss,
                bool(line.points) and line.points[-1].accuracy < line.points[0].accuracy)


def read_points(store: Any, sweeps: list[Sweep]) -> list[GridPoint]:
    points: list[GridPoint] = []
    for sweep in sweeps:
        by_point: dict[str, GridPoint] = {}
        for run in studies_named(store, sweep.name):
            point = run["config"]["study"]["point"]
            batch = int(point["per_device_train_batch_size"])
            found = by_point.setdefault(json.dumps(point, sort_keys=True), GridPoint(
                sweep.method, sweep.label, batch // GENERATIONS if sweep.method == "grpo" else batch,
                float(point["learning_rate"]), dict(point), []))
            found.seeds.append(read_seed(store, run))
        points += by_point.values()
    return points


def best(points: list[GridPoint], method: str) -> GridPoint | None:
    """The method's point of highest median final accuracy over its seeds, among those whose every seed finished
    without a NaN loss; never a single seed's pick when several ran."""
    mine = [p for p in points if p.method == method and p.eligible]
    return max(mine, key=lambda p: p.median("final"), default=None)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def print_table(points: list[GridPoint]) -> None:
    from app.studies.comparison import format_duration

    print("\n| method | selection / recipe | prompts per step | learning rate | seeds finished | final held-out "
          "accuracy, median (range) | training time | completion tokens | peak memory GiB | diverged |")
    print("| --- " * 10 + "|")
    for p in points:
        done = [s.final for s in p.seeds if s.status == "finished" and s.final is not None]
        spread = f" ({pct(min(done))}–{pct(max(done))})" if done else ""
        seconds, tokens, peak = p.median("seconds"), p.median("tokens"), p.median("peak_gb")
        diverged = ", ".join(f"#{s.run_id} ({'NaN loss' if s.nan_loss else 'below its start'})"
                             for s in p.seeds if s.diverged) or "no"
        label = SELECTION_LABELS.get(p.label, p.label)
        print(f"| {'A*-PO' if p.method == 'a2po' else 'GRPO'} | {label} | {p.prompts} | {p.learning_rate:g} "
              f"| {len(done)} of {len(p.seeds)} | {pct(p.median('final'))}{spread} "
              f"| {'–' if seconds is None else format_duration(seconds)} "
              f"| {'–' if tokens is None else f'{round(tokens):,}'} | {'–' if peak is None else f'{peak:.2f}'} "
              f"| {diverged} |")


def report(options: argparse.Namespace, sweeps: list[Sweep], duels: bool = True) -> dict[str, GridPoint]:
    """Print the search's table, each method's best point and (`duels`) the duels run at them; returns the best
    points by method."""
    from storage import Store

    store = Store(options.data_dir / "studio.db")
    points = read_points(store, sweeps)
    if not points:
        raise SystemExit(f"No study of the search {options.name!r} in {options.data_dir}: run it first (without "
                         "--report), or give its --name.")
    print_table(points)
    chosen = {}
    for method, label in (("a2po", "A*-PO"), ("grpo", "GRPO")):
        found = best(points, method)
        if found is None:
            print(f"\n{label}: no grid point has every seed finished without a NaN loss yet.", flush=True)
            continue
        chosen[method] = found
        warn = " (one seed: run --seeds 0 1 2 before taking this pick)" if len(found.seeds) < 2 else ""
        print(f"\n{label}'s best point: {SELECTION_LABELS.get(found.label, found.label)}, {found.prompts} prompts per "
              f"step, learning rate {found.learning_rate:g}: median final held-out accuracy "
              f"{pct(found.median('final'))} over {len(found.seeds)} seeds{warn}", flush=True)
    if duels:
        print_duels(options, store)
    return chosen


# ----------------------------------------------------------------------------------------------------------------
# The duel at each method's best point


def duel_name(options: argparse.Namespace, minutes: float) -> str:
    return f"{options.name}-duel-{minutes:g}min"


def duel_request(options: argparse.Namespace, a2po: GridPoint, grpo: GridPoint, minutes: float) -> dict[str, Any]:
    """The `/launch_pair` arguments of the duel at `minutes`: A*-PO's spec at its best point, GRPO's recipe and its
    own learning rate and batch (`grpo_settings`, equal time only)."""
    spec = base_spec(options, duel_name(options, minutes), "a2po")
    spec["config"] = {k: v for k, v in spec["config"].items() if k not in budget(1.0)}  # the protocol sets these
    spec["config"].update(SELECTIONS[a2po.label], **a2po.settings)
    if a2po.label == "solved":
        # The protocols set filter_all_incorrect themselves (off under equal time); p > 0 is the band [1/N, 1].
        n = int(spec["config"].get("num_value_samples") or GENERATIONS)
        spec["config"].update(filter_all_incorrect=False, pass_rate_band=[1 / n, 1.0])
    return {"spec": spec, "protocol": "time", "budget_minutes": minutes, "seeds": options.seeds,
            "grpo_recipe": grpo.label, "grpo_settings": dict(grpo.settings)}


def duel(options: argparse.Namespace, sweeps: list[Sweep]) -> None:
    from storage import Store

    chosen = report(options, sweeps, duels=False)
    if set(chosen) != {"a2po", "grpo"}:
        raise SystemExit("The duel needs each method's best point: let the search finish first (--report shows it).")

    def launch(client: Any, store: Any) -> list[int]:
        ids = []
        for minutes in options.duel_minutes or [4.0, 8.0]:
            name = duel_name(options, minutes)
            if earlier := studies_named(store, name):
                print(f"duel {name}: in {options.data_dir} already", flush=True)
                ids += [r["id"] for r in earlier]
                continue
            made = client.predict(**duel_request(options, chosen["a2po"], chosen["grpo"], minutes),
                                  api_name="/launch_pair")
            print(f"duel {name} ({made['study']}): " + ", ".join(f"{m} #{p[m]['run_id']}" for p in made["pairs"]
                                                                for m in ("a2po", "grpo")), flush=True)
            ids += [p[m]["run_id"] for p in made["pairs"] for m in ("a2po", "grpo")]
        return ids

    serve(options, launch)
    print_duels(options, Store(options.data_dir / "studio.db"))


def print_duels(options: argparse.Namespace, store: Any) -> None:
    """Each duel in DATA_DIR as markdown: its settings, a row per method (median and range of the final held-out
    accuracy, time with stage 1), and the verdict the Compare page gives."""
    from app.studies import comparison

    prefix = duel_name(options, 0.0).removesuffix("0min")
    names = {((r.get("config") or {}).get("study") or {}).get("name") or "" for r in store.list_runs()}
    for name in sorted((n for n in names if n.startswith(prefix)), key=lambda n: float(n[len(prefix):-3] or 0)):
        runs, minutes = studies_named(store, name), float(name[len(prefix):-3] or 0)
        timelines = [comparison.store_timeline(store, r) for r in runs]
        tag = runs[0]["config"]["study"]
        first = next(r for r in runs if r["config"].get("method", "a2po") == "a2po")["config"]
        a2po, grpo = first["config"], tag.get("grpo_settings") or {}
        seeds = [str(comparison.run_seed(r)) for r in runs if r["config"].get("method", "a2po") == "a2po"]
        print(f"\n### A*-PO vs GRPO at {minutes:g} minutes each, each method at its best point ({options.task})\n")
        print(f"A*-PO: {a2po['per_device_train_batch_size']} prompts per step, learning rate "
              f"{a2po['learning_rate']:g}, pass_rate_band {a2po.get('pass_rate_band')}; GRPO: recipe "
              f"{tag.get('grpo_recipe') or 'none'}, "
              + (f"{grpo['per_device_train_batch_size'] // GENERATIONS} prompts per step, learning rate "
                 f"{grpo['learning_rate']:g}" if set(grpo) == {"per_device_train_batch_size", "learning_rate"}
                 else "prompts per step and learning rate matched to A*-PO's")
              + f"; seeds {', '.join(seeds)}; {first['dataset'].get('eval_size')} held-out prompts.\n")
        print("| method | final held-out accuracy, median (range) | time with stage 1, median | runs |")
        print("| --- | --- | --- | --- |")
        for method, label in (("a2po", "A*-PO"), ("grpo", "GRPO")):
            done = [t for t in comparison.finished(timelines) if t.method == method]
            finals = [t.final_accuracy for t in done]
            spread = f" ({pct(min(finals))}–{pct(max(finals))})" if finals else ""
            seconds = statistics.median(t.seconds_with_stage1 for t in done) if done else None
            print(f"| {label} | {pct(statistics.median(finals)) if finals else '–'}{spread} "
                  f"| {'–' if seconds is None else comparison.format_duration(seconds)} "
                  f"| {', '.join(f'#{t.run_id} {t.status}' for t in timelines if t.method == method)} |")
        pair = comparison.study_view(runs, timelines).pair()
        if pair:
            print(f"\n{comparison.verdict(*pair, margin=MARGIN)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--task", default="teaching-demo", choices=sorted(TASKS))
    parser.add_argument("--name", default="recipe-search", help="the studies' name prefix")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, nargs="+", default=None,
                        help="training time per run, stage 1 counted: one value for the search (4 by default); "
                             "with --duel, each duel's budget (4 8 by default)")
    parser.add_argument("--a2po-batch", type=int, nargs="+", default=[8, 16, 32, 64], help="A*-PO's prompts per step")
    parser.add_argument("--grpo-batch", type=int, nargs="+", default=[4, 8, 16],
                        help=f"GRPO's prompts per step ({GENERATIONS} completions each)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 3e-5], help="learning rates, both methods")
    parser.add_argument("--selections", nargs="+", default=list(SELECTIONS), choices=list(SELECTIONS),
                        help="A*-PO's prompt selections: every prompt, p > 0, the band [0.25, 0.75]")
    parser.add_argument("--recipes", nargs="+", default=["dapo", "dr-grpo"], help="GRPO's recipes (a2po.recipes)")
    parser.add_argument("--spec", default="{}", help="JSON merged into every run's spec (the teaching demo's); "
                        "its A*-PO-only settings go to the A*-PO runs")
    parser.add_argument("--model-root", default="", help="a folder of local models the studio may load")
    parser.add_argument("--port", type=int, default=7874)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the runs it would launch; start nothing")
    mode.add_argument("--report", action="store_true", help="only report the search (and duels) in DATA_DIR")
    mode.add_argument("--duel", action="store_true", help="the duel at each method's best point of a finished search")
    options = parser.parse_args()

    from a2po.recipes import RecipeError, canonical_name

    try:
        options.recipes = [canonical_name(r) for r in options.recipes]
    except RecipeError as error:
        parser.error(f"--recipes: {error}")
    if options.duel:
        options.duel_minutes, options.minutes = options.minutes, [4.0]
    else:
        options.duel_minutes = None
        if options.minutes is not None and len(options.minutes) != 1:
            parser.error("--minutes: the search runs at one budget (e.g. --minutes 4); several are for --duel.")
        options.minutes = options.minutes or [4.0]
    if any(m <= 0 for m in options.minutes + (options.duel_minutes or [])):
        parser.error("--minutes: give minutes > 0, e.g. --minutes 4.")
    if len(set(options.seeds)) != len(options.seeds):
        parser.error("--seeds: each seed once, e.g. --seeds 0 1 2.")
    sweeps = plan(options)
    if options.dry_run:
        dry_run(options, sweeps)
    elif options.duel:
        duel(options, sweeps)
    else:
        if not options.report:
            search(options, sweeps)
        report(options, sweeps)


if __name__ == "__main__":
    main()
