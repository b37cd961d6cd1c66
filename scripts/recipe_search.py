"""The recipe search (issues 39 and 44): each method's best settings at equal compute, found by the studio's own
halving sweeps, then the duel "A*-PO vs GRPO" with each method at its best point.

    python scripts/recipe_search.py DATA_DIR --dry-run      # the studies, their rung-0 runs, the most runs each makes
    python scripts/recipe_search.py DATA_DIR                # the search, rung by rung, then its table (resumes)
    python scripts/recipe_search.py DATA_DIR --report       # the table of a search that ran (or still runs)
    python scripts/recipe_search.py RESULTS.json --report   # the same table from a results file (--results)
    python scripts/recipe_search.py DATA_DIR --duel         # the duels at each method's best (equal compute, 3 seeds)
    python scripts/recipe_search.py DATA_DIR --duel --protocol time --minutes 4   # the same at equal time
    python scripts/recipe_search.py DATA2 --task basic-arithmetic                   # reasoning-gym basic_arithmetic

Every run of the search has one budget of compute (`--budget-flops`, `max_train_flops`: FLOPs counted from the tokens
it processes, A*-PO's stage 1 included, so the answer is the same on any machine and under any load; docs/compute.md),
held-out accuracy on 128 prompts at every quarter of it. One studio sweep per study, halved (`/launch_study` with
`halving`, docs/studies.md): every point trains with run seed 0 on 1/9 of the budget's training part (what stage 1
leaves of it), the best third by held-out accuracy go on to 1/3 of it, the best third of those to the whole budget
with run seeds 0, 1 and 2; the studio launches each rung when the one before has ended, and marks the others pruned.

    a2po            prompts per step (`--a2po-batch`) x learning rate (`--lrs`) x selection by reference pass rate:
                    every prompt; p > 0 (the band [1/N, 1], TRL's `filter_all_incorrect`); p in [0.25, 0.75]
    grpo-<recipe>   one study per recipe (`--recipes`: DAPO, Dr. GRPO): learning rate x prompts per step
                    (`--grpo-batch`; G = 8 completions each, so per_device_train_batch_size is 8 x that)

Started again, it waits for the studies already in DATA_DIR instead of launching them (the studio itself resumes
interrupted runs and launches the rungs still due), so an interrupted search continues by running the same command.
`--results FILE` writes the table as JSON whenever a run ends (the search's state so far, with the commit it runs
at), for docs/benchmarks.md. The report picks each method's best point among those of the last rung by the median
over seeds of the final held-out accuracy; the duels press "A*-PO vs GRPO" (`/launch_pair`, protocol "compute" or
"time") at those points with fresh seeds (`--duel-seeds`, 3 4 5: a best point is not judged again on the seeds that
made it the best) and print the verdicts, each with its paired bootstrap interval; the results file keeps them too.
The equal-time duel's A*-PO runs sample their own stage 1 (`TIME_DUEL_VALUES_SEED`) inside their minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks` is not installed
ROOT = Path(__file__).resolve().parents[1]
GENERATIONS = 8  # GRPO's G, the teaching demo's N
EVAL_SIZE = 128
EVAL_POINTS = 4  # held-out evaluations per budget (and the one before training)
# The equal-time duel's stage-1 seed, one no run of the search (0) or the compute duel (its run seeds) samples with:
# its A*-PO runs share the one V* set its first run samples, each charged that set's seconds.
TIME_DUEL_VALUES_SEED = 1000
SELECTIONS = {"every": None, "solved": [1 / GENERATIONS, 1.0], "band": [0.25, 0.75]}
SELECTION_LABELS = {"None": "every prompt", repr([1 / GENERATIONS, 1.0]): "p > 0", "[0.25, 0.75]": "p in [0.25, 0.75]"}
# docs/benchmarks.md, "A reasoning-gym task with SmolLM2 on this CPU": the task SmolLM2 learns on this CPU.
TASKS = {
    "teaching-demo": {},
    "basic-arithmetic": {"source": "reasoning-gym", "task": "basic_arithmetic", "answer_format": "number",
                         "settings": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                      "operators": ["+"], "allow_negation": False},
                         "system_prompt": "", "num_prompts": 256, "seed": 0},
}


@dataclass(frozen=True)
class Study:
    """One halving sweep of the search: A*-PO, or GRPO under one recipe."""

    name: str
    method: str
    recipe: str | None
    spec: dict[str, Any]
    grid: dict[str, list[Any]]


def base_spec(options: argparse.Namespace, name: str, method: str) -> dict[str, Any]:
    """The teaching demo's spec on the task, at the budget: every run trains until its compute is spent."""
    from app.studies.protocols import TIME_EPOCHS

    extra = json.loads(options.spec)
    spec = {"preset": "teaching-demo", **extra, "name": name,
            "dataset": {**TASKS[options.task], "eval_size": EVAL_SIZE, **extra.get("dataset", {})}}
    spec["config"] = {**extra.get("config", {}), "max_train_flops": options.budget_flops,
                      "eval_every_flops": options.budget_flops / EVAL_POINTS, "eval_steps": None, "max_steps": -1,
                      "num_train_epochs": TIME_EPOCHS, "max_train_seconds": None, "eval_every_seconds": None}
    if method == "grpo":  # the A*-PO settings of the preset and --spec (N, beta1, ...) go to the A*-PO runs only
        from a2po.runspec import METHOD_CONFIG_FIELDS, with_defaults

        full = with_defaults(spec)
        spec = {**full, "method": "grpo"}
        spec["config"] = {k: v for k, v in full["config"].items() if k in METHOD_CONFIG_FIELDS["grpo"]}
        spec["config"]["num_generations"] = GENERATIONS
    return spec


def plan(options: argparse.Namespace) -> list[Study]:
    studies = []
    spec = base_spec(options, f"{options.name}-a2po", "a2po")
    spec["config"]["filter_all_incorrect"] = False  # the selections are pass-rate bands: p > 0 is [1/N, 1]
    studies.append(Study(spec["name"], "a2po", None, spec,
                         {"per_device_train_batch_size": options.a2po_batch, "learning_rate": options.lrs,
                          "pass_rate_band": [SELECTIONS[s] for s in options.selections]}))
    for recipe in options.recipes:
        spec = base_spec(options, f"{options.name}-grpo-{recipe}", "grpo")
        spec["recipe"] = recipe
        studies.append(Study(spec["name"], "grpo", recipe, spec,
                             {"per_device_train_batch_size": [GENERATIONS * p for p in options.grpo_batch],
                              "learning_rate": options.lrs}))
    return studies


def dry_run(options: argparse.Namespace, studies: list[Study]) -> None:
    """Print every rung-0 run the search would launch (the studio's own sweep specs) and the most runs each study
    makes; start nothing."""
    from a2po.runspec import RunSpec, with_defaults
    from a2po.sweep import Halving
    from app.studies.sweeps import sweep_specs

    halving, most = Halving.parse(json.loads(options.halving)), 0
    for study in studies:
        runs = sweep_specs(with_defaults(study.spec), study.grid, options.seeds, halving=halving)
        for run in runs:
            RunSpec.from_dict(run)  # the library's checks of each run: a bad flag stops here, not in the studio
        most += halving.max_runs(len(runs), len(options.seeds))
        print(f"study {study.name}: {len(runs)} points at rung 0, at most "
              f"{halving.max_runs(len(runs), len(options.seeds))} runs", flush=True)
        for run in runs:
            print(f"  {run['name']}", flush=True)
    shares = ", ".join(f"{halving.share(r):.3g}" for r in range(halving.rungs))
    print(f"\nat most {most} runs in {len(studies)} studies, {options.budget_flops:.3g} FLOPs each at the last rung "
          f"(rungs on {shares} of the budget's training part); then --duel: {len(options.duel_seeds)} seed(s) x 2 "
          "methods at the whole budget.", flush=True)


# ----------------------------------------------------------------------------------------------------------------
# Running it


def study_runs(store: Any, name: str) -> list[dict[str, Any]]:
    """The runs of the newest study named `name`, by id ([] if none)."""
    runs = [r for r in store.list_runs() if ((r.get("config") or {}).get("study") or {}).get("name") == name]
    if not runs:
        return []
    newest = max(runs, key=lambda r: r["id"])["config"]["study"]["id"]
    return sorted((r for r in runs if r["config"]["study"]["id"] == newest), key=lambda r: r["id"])


def done(runs: list[dict[str, Any]]) -> bool:
    """Whether a halving study has ended: every run ended, and its top rung is its last."""
    from app.studies.sweeps import ENDED, halving_of

    if not runs or any(r["status"] not in ENDED for r in runs):
        return False
    halving, _ = halving_of(runs[0])
    return max(halving_of(r)[1] for r in runs) == halving.rungs - 1


def serve(options: argparse.Namespace, launch: Any, names: list[str]) -> None:
    """A studio on DATA_DIR; `launch(client, store)` starts what is missing, then every study of `names` is waited
    for (the studio launches their later rungs), the results file rewritten whenever a run ends."""
    from gradio_client import Client

    from benchmarks.harness import studio
    from storage import Store

    args = ["--model-root", options.model_root] if options.model_root else []
    store = Store(options.data_dir / "studio.db")
    with studio(options.data_dir, *args, port=options.port) as app:
        launch(Client(app.url, verbose=False), store)
        seen: set[int] = set()
        while True:
            runs = {name: study_runs(store, name) for name in names}
            ended = {r["id"] for rs in runs.values() for r in rs if r["status"] in ("finished", "failed", "stopped")}
            if ended != seen:
                for run in (r for rs in runs.values() for r in rs if r["id"] in ended - seen):
                    print(f"run #{run['id']} {run['name']}: {run['status']}", flush=True)
                seen = ended
                write_results(options, store)
            if all(done(rs) for rs in runs.values()):
                return
            time.sleep(10.0)


def search(options: argparse.Namespace, studies: list[Study]) -> None:
    def launch(client: Any, store: Any) -> None:
        for study in studies:
            if earlier := study_runs(store, study.name):
                print(f"study {study.name}: in {options.data_dir} already ({len(earlier)} runs)", flush=True)
                continue
            made = client.predict(spec=study.spec, grid=study.grid, seeds=options.seeds,
                                  halving=json.loads(options.halving), api_name="/launch_study")
            print(f"study {study.name} ({made['study']}): {len(made['runs'])} runs at rung 0", flush=True)

    serve(options, launch, [s.name for s in studies])


# ----------------------------------------------------------------------------------------------------------------
# Reading the search back


def read(store: Any, studies: list[Study]) -> dict[str, Any]:
    """Each study's rows (`app.studies.summary`) with the figures the table shows, and each method's best point."""
    from app.studies import comparison, summary

    found: dict[str, Any] = {"studies": {}, "best": {}}
    for study in studies:
        runs = study_runs(store, study.name)
        if not runs:
            continue
        lines = [comparison.store_timeline(store, r) for r in runs]
        read_back = summary.summarize(runs, lines)
        by_id = {t.run_id: t for t in lines}
        by_rung = rung_finals(runs, by_id)
        rows = []
        for row in read_back.rows:
            mine = [by_id[i] for i in row.run_ids]
            peaks = [t.peak_memory_gb for t in mine if t.peak_memory_gb is not None]
            rows.append({"point": row.point, "state": row.state, "runs": row.run_ids, "statuses": row.statuses,
                         "final": row.final, "final_range": row.final_range, "compute_flops": row.flops,
                         "training_seconds": row.training_seconds, "tokens": row.tokens,
                         "peak_memory_gb": max(peaks) if peaks else None,
                         "finals": [t.final_accuracy for t in mine],
                         "rungs": by_rung.get(row.label, [])})
        found["studies"][study.name] = {"method": study.method, "recipe": study.recipe, "rows": rows}
        best = read_back.best
        if best is not None:
            mine = {"study": study.name, "recipe": study.recipe, "point": best.point, "final": best.final,
                    "final_range": best.final_range, "runs": best.run_ids}
            held = found["best"].get(study.method)
            if held is None or mine["final"] > held["final"]:
                found["best"][study.method] = mine
    return found


def rung_finals(runs: list[dict[str, Any]], timelines: dict[int, Any]) -> dict[str, list[list[float]]]:
    """Each point's final held-out accuracies (its finished runs') at every rung it ran, by point label: the path a
    point took through the halving, not only where it stopped."""
    from a2po.sweep import point_label
    from app.studies.sweeps import halving_of

    found: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        tagged = halving_of(run)
        timeline = timelines[run["id"]]
        if tagged is None or run["status"] != "finished" or timeline.final_accuracy is None:
            continue
        label = point_label(run["config"]["study"]["point"])
        found.setdefault(label, {}).setdefault(tagged[1], []).append(timeline.final_accuracy)
    return {label: [rungs.get(r, []) for r in range(max(rungs) + 1)] for label, rungs in found.items()}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_results(options: argparse.Namespace, store: Any) -> None:
    if options.results is None:
        return
    # "commit" names the code the search's runs ran at: a report written later by another checkout keeps it.
    earlier = json.loads(options.results.read_text()) if options.results.is_file() else {}
    found = read(store, plan(options))
    found["duels"] = read_duels(options, store)
    found.update(task=options.task, budget_flops=options.budget_flops, halving=json.loads(options.halving),
                 seeds=options.seeds, commit=earlier.get("commit") or commit(), written_by=commit(),
                 written_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    options.results.parent.mkdir(parents=True, exist_ok=True)
    tmp = options.results.with_suffix(".tmp")
    tmp.write_text(json.dumps(found, indent=1, default=str))
    tmp.replace(options.results)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def point_text(method: str, point: dict[str, Any]) -> tuple[str, str, str]:
    """(selection, prompts per step, learning rate) of a grid point, as the table shows them."""
    batch = int(point["per_device_train_batch_size"])
    selection = SELECTION_LABELS.get(repr(point.get("pass_rate_band")), str(point.get("pass_rate_band")))
    return (selection if method == "a2po" else "–", str(batch // GENERATIONS if method == "grpo" else batch),
            f"{float(point['learning_rate']):g}")


def print_table(found: dict[str, Any]) -> None:
    from a2po.compute import format_flops
    from app.studies.comparison import format_duration

    print("\n| study | selection | prompts per step | learning rate | halving | held-out accuracy at each rung's end "
          "| final held-out accuracy, median (range) | compute | training time | completion tokens | peak memory GiB |")
    print("| --- " * 11 + "|")
    for name, study in found["studies"].items():
        for row in study["rows"]:
            selection, batch, lr = point_text(study["method"], row["point"])
            low_high = row["final_range"]
            spread = f" ({pct(low_high[0])}–{pct(low_high[1])})" if low_high and len(row["runs"]) > 1 else ""
            tokens = row["tokens"]
            path = " → ".join(pct(_median(finals)) for finals in row.get("rungs") or []) or "–"
            print(f"| {name} | {selection} | {batch} | {lr} | {row['state']} | {path} | {pct(row['final'])}{spread} | "
                  f"{format_flops(row['compute_flops'])} | {format_duration(row['training_seconds'])} | "
                  f"{'–' if tokens is None else f'{round(tokens):,}'} | "
                  f"{'–' if row['peak_memory_gb'] is None else format(row['peak_memory_gb'], '.2f')} |")
    for method, label in (("a2po", "A*-PO"), ("grpo", "GRPO")):
        best = found["best"].get(method)
        if best is None:
            print(f"\n{label}: no point has finished its last rung yet.", flush=True)
            continue
        selection, batch, lr = point_text(method, best["point"])
        print(f"\n{label}'s best point ({best['study']}): {selection if method == 'a2po' else best['recipe']}, "
              f"{batch} prompts per step, learning rate {lr}: median final held-out accuracy {pct(best['final'])} "
              f"over {len(best['runs'])} seeds ({pct(best['final_range'][0])}–{pct(best['final_range'][1])})",
              flush=True)


def report(options: argparse.Namespace, studies: list[Study]) -> dict[str, Any]:
    from storage import Store

    store = Store(options.data_dir / "studio.db")
    found = read(store, studies)
    if not found["studies"]:
        raise SystemExit(f"No study of the search {options.name!r} in {options.data_dir}: run it first (without "
                         "--report), or give its --name.")
    print_table(found)
    write_results(options, store)
    print_duels(read_duels(options, store))
    return found


# ----------------------------------------------------------------------------------------------------------------
# The duel at each method's best point


def duel_name(options: argparse.Namespace) -> str:
    budget = f"{options.minutes:g}min" if options.protocol == "time" else f"{options.budget_flops:.3g}flops"
    return f"{options.name}-duel-{options.protocol}-{budget}"


def duel_request(options: argparse.Namespace, found: dict[str, Any]) -> dict[str, Any]:
    """The `/launch_pair` arguments of the duel: A*-PO's spec at its best point, GRPO's recipe and its own learning
    rate and batch (`grpo_settings`)."""
    a2po, grpo = found["best"]["a2po"], found["best"]["grpo"]
    spec = base_spec(options, duel_name(options), "a2po")
    for key in ("max_train_flops", "eval_every_flops", "max_train_seconds", "eval_every_seconds", "eval_steps",
                "max_steps", "num_train_epochs"):
        spec["config"].pop(key, None)  # the protocol sets these
    spec["config"].update(a2po["point"], filter_all_incorrect=False)
    if options.protocol == "time":
        # A V* set reused from the equal-compute duel (the same run seeds) is charged the seconds it took then, on a
        # machine the compute duel may have shared; the time duel samples its own, on the quiet machine it measures.
        spec["config"]["values_seed"] = TIME_DUEL_VALUES_SEED
    budget = ({"budget_minutes": options.minutes} if options.protocol == "time" else
              {"budget_flops": options.budget_flops})
    return {"spec": spec, "protocol": options.protocol, **budget, "seeds": options.duel_seeds,
            "grpo_recipe": grpo["recipe"], "grpo_settings": dict(grpo["point"])}


def duel(options: argparse.Namespace, studies: list[Study]) -> None:
    found = report(options, studies)
    if set(found["best"]) != {"a2po", "grpo"}:
        raise SystemExit("The duel needs each method's best point: let the search finish first (--report shows it).")
    name = duel_name(options)

    def launch(client: Any, store: Any) -> None:
        if study_runs(store, name):
            print(f"duel {name}: in {options.data_dir} already", flush=True)
            return
        made = client.predict(**duel_request(options, found), api_name="/launch_pair")
        print(f"duel {name} ({made['study']}): " + ", ".join(f"{m} #{p[m]['run_id']}" for p in made["pairs"]
                                                              for m in ("a2po", "grpo")), flush=True)

    from app.studies.sweeps import ENDED
    from storage import Store

    store = Store(options.data_dir / "studio.db")
    args = ["--model-root", options.model_root] if options.model_root else []
    from gradio_client import Client

    from benchmarks.harness import studio

    with studio(options.data_dir, *args, port=options.port) as app:
        launch(Client(app.url, verbose=False), store)
        while not all(r["status"] in ENDED for r in study_runs(store, name)):
            time.sleep(10.0)
    write_results(options, store)
    print_duels(read_duels(options, store))


def read_duels(options: argparse.Namespace, store: Any) -> list[dict[str, Any]]:
    """Each duel of the search in DATA_DIR: its settings, per method the final held-out accuracies (median, range),
    compute and time with stage 1 (medians) and its runs, the paired difference with its bootstrap interval, and the
    verdict in time; what `print_duels` shows and the results file keeps."""
    from app.studies import comparison

    prefix = f"{options.name}-duel-"
    names = sorted({((r.get("config") or {}).get("study") or {}).get("name") or "" for r in store.list_runs()})
    duels = []
    for name in (n for n in names if n.startswith(prefix)):
        runs = study_runs(store, name)
        timelines = [comparison.store_timeline(store, r) for r in runs]
        tag = runs[0]["config"]["study"]
        a2po_runs = [r for r in runs if comparison.run_method(r) == "a2po"]
        a2po_spec = a2po_runs[0]["config"]
        a2po, grpo = a2po_spec["config"], tag.get("grpo_settings") or {}
        methods = {}
        for method in ("a2po", "grpo"):
            mine = [t for t in comparison.finished(timelines) if t.method == method]
            finals = [t.final_accuracy for t in mine]
            methods[method] = {"finals": finals, "final": _median(finals),
                               "compute_flops": _median([t.flops_with_stage1 for t in mine
                                                         if t.flops_with_stage1 is not None]),
                               "seconds": _median([t.seconds_with_stage1 for t in mine]),
                               "runs": [[t.run_id, t.status] for t in timelines if t.method == method]}
        difference = comparison.method_difference(store, runs)
        pair = comparison.study_view(runs, timelines).pair()
        duels.append({
            "name": name, "protocol": tag.get("protocol"), "task": options.task,
            "seeds": [comparison.run_seed(r) for r in a2po_runs],
            "eval_size": a2po_spec["dataset"].get("eval_size"),
            "a2po_point": {"per_device_train_batch_size": a2po["per_device_train_batch_size"],
                           "learning_rate": a2po["learning_rate"], "pass_rate_band": a2po.get("pass_rate_band")},
            "grpo_recipe": tag.get("grpo_recipe"), "grpo_point": grpo, "methods": methods,
            "difference": None if difference is None else {**dataclasses.asdict(difference), "text": difference.text()},
            "verdict": comparison.verdict(*pair) if pair else None})
    return duels


def print_duels(duels: list[dict[str, Any]]) -> None:
    """Each duel (`read_duels`) as markdown: its settings, a row per method, the difference and the verdict."""
    from a2po.compute import format_flops
    from app.studies.comparison import format_duration

    for duel in duels:
        a2po, grpo = duel["a2po_point"], duel["grpo_point"]
        print(f"\n### A*-PO vs GRPO, {duel['protocol']} protocol, each method at its best point ({duel['task']}; "
              f"{duel['name']})\n")
        print(f"A*-PO: {a2po['per_device_train_batch_size']} prompts per step, learning rate "
              f"{a2po['learning_rate']:g}, pass_rate_band {a2po.get('pass_rate_band')}; GRPO: recipe "
              f"{duel['grpo_recipe'] or 'none'}, {int(grpo.get('per_device_train_batch_size', 0)) // GENERATIONS} "
              f"prompts per step, learning rate {float(grpo.get('learning_rate', 0)):g}; seeds "
              f"{', '.join(str(seed) for seed in duel['seeds'])}; {duel['eval_size']} held-out prompts.\n")
        print("| method | final held-out accuracy, median (range) | compute with stage 1, median | time with stage 1, "
              "median | runs |")
        print("| --- | --- | --- | --- | --- |")
        for method, label in (("a2po", "A*-PO"), ("grpo", "GRPO")):
            mine = duel["methods"][method]
            finals = mine["finals"]
            spread = f" ({pct(min(finals))}–{pct(max(finals))})" if finals else ""
            print(f"| {label} | {pct(mine['final'])}{spread} | {format_flops(mine['compute_flops'])} | "
                  f"{format_duration(mine['seconds'])} | "
                  f"{', '.join(f'#{run_id} {status}' for run_id, status in mine['runs'])} |")
        if duel["difference"]:
            print(f"\n{duel['difference']['text']}", flush=True)
        if duel["verdict"]:
            print(f"\n{duel['verdict']}", flush=True)


def _median(values: list[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a bad recipe, halving, budget or seed list stops here, before any studio starts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="the search's data folder (or, with --report, its results JSON)")
    parser.add_argument("--task", default="teaching-demo", choices=sorted(TASKS))
    parser.add_argument("--name", default="recipe-search", help="the studies' name prefix")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the last rung's run seeds")
    parser.add_argument("--duel-seeds", type=int, nargs="+", default=[3, 4, 5],
                        help="the duels' run seeds: by default not the ones the search chose its best points on, so a "
                        "point that won by the luck of its seeds is not judged on that luck again")
    parser.add_argument("--budget-flops", type=float, default=4e13,
                        help="each run's compute at the last rung, stage 1 included (FLOPs; docs/compute.md)")
    parser.add_argument("--halving", default='{"reduction_factor": 3, "rungs": 3}',
                        help="the studio's halving (JSON, `/launch_study`)")
    parser.add_argument("--a2po-batch", type=int, nargs="+", default=[8, 16, 32, 64], help="A*-PO's prompts per step")
    parser.add_argument("--grpo-batch", type=int, nargs="+", default=[4, 8, 16],
                        help=f"GRPO's prompts per step ({GENERATIONS} completions each)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 3e-5], help="learning rates, both methods")
    parser.add_argument("--selections", nargs="+", default=list(SELECTIONS), choices=list(SELECTIONS),
                        help="A*-PO's prompt selections: every prompt, p > 0, the band [0.25, 0.75]")
    parser.add_argument("--recipes", nargs="+", default=["dapo", "dr-grpo"], help="GRPO's recipes (a2po.recipes)")
    parser.add_argument("--spec", default="{}", help="JSON merged into every run's spec (the teaching demo's); "
                        "its A*-PO-only settings go to the A*-PO runs")
    parser.add_argument("--results", type=Path, default=None, help="write the table as JSON here as runs end")
    parser.add_argument("--protocol", default="compute", choices=["compute", "time"], help="the duel's protocol")
    parser.add_argument("--minutes", type=float, default=4.0, help="the equal-time duel's budget per run")
    parser.add_argument("--model-root", default="", help="a folder of local models the studio may load")
    parser.add_argument("--port", type=int, default=7874)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the runs it would launch; start nothing")
    mode.add_argument("--report", action="store_true", help="only report the search (and duels) in DATA_DIR")
    mode.add_argument("--duel", action="store_true", help="the duel at each method's best point of a finished search")
    options = parser.parse_args(argv)

    from a2po.recipes import RecipeError, canonical_name
    from a2po.sweep import GridError, Halving

    try:
        options.recipes = [canonical_name(r) for r in options.recipes]
    except RecipeError as error:
        parser.error(f"--recipes: {error}")
    try:
        Halving.parse(json.loads(options.halving))
    except (GridError, ValueError) as error:
        parser.error(f"--halving: {error}")
    if options.budget_flops <= 0 or options.minutes <= 0:
        parser.error("--budget-flops and --minutes take numbers > 0, e.g. --budget-flops 4e13.")
    for flag, seeds in (("--seeds", options.seeds), ("--duel-seeds", options.duel_seeds)):
        if len(set(seeds)) != len(seeds):
            parser.error(f"{flag}: each seed once, e.g. {flag} 0 1 2.")
    if options.data_dir.suffix == ".json" and (not options.report or not options.data_dir.is_file()):
        parser.error(f"{options.data_dir}: a results file is read only with --report, and must exist.")
    return options


def main() -> None:
    options = parse_options()
    if options.data_dir.suffix == ".json":
        found = json.loads(options.data_dir.read_text())
        print_table(found)
        print_duels(found.get("duels", []))
        return
    studies = plan(options)
    if options.dry_run:
        dry_run(options, studies)
    elif options.duel:
        duel(options, studies)
    else:
        if not options.report:
            search(options, studies)
        report(options, studies)


if __name__ == "__main__":
    main()
