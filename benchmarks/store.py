"""Storage benchmark: how long each query the dashboard makes takes on a big run.

    python -m benchmarks.store                                   # 100k prompts x N=8, 1M samples, 200k metrics
    python -m benchmarks.store --db /tmp/bench.db --keep         # keep the filled file; a later run reuses it
    python -m benchmarks.store --prompts 2000 --samples 20000 --metrics 4000 --repeats 3    # a quick look
    python -m benchmarks.store --db postgresql+psycopg://user@host/bench    # the same on a PostgreSQL server

It fills a database with one train run (its V* set of `--prompts` prompts with N completions each, `--samples`
stage-2 samples, `--metrics` metric rows, logs and evaluations) plus a few small runs, then times (median of
`--repeats`) every query the dashboard makes, against the dashboard's targets: each poll query <= 50 ms, opening
any Run page view <= 300 ms. Each operation is timed twice where the dashboard changed how it gets its data:
"previous" is what the dashboard did before (whole splits with their completions, every metric row, tables
built in memory for CSV), "current" is what it does now. CSV exports are timed once each and their peak memory
measured in a fresh process (peak RSS above the RSS before the export).

The fill goes through the Store's own write methods in large batches (so the per-split counts and the latest
metrics are maintained as in a real run) and prints how long it took.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from storage import lifecycle
from storage.store import Store
from storage.writes import add_metrics as store_add_metrics  # the Store's statements, many steps a transaction

BENCH_RUN = "storage-bench"
POLL_TARGET_MS = 50.0
VIEW_TARGET_MS = 300.0
TRAIN_METRICS = ["loss", "reward", "advantage", "implicit_reward", "log_ratio", "completion_length",
                 "learning_rate", "eval_accuracy"]
OTHER_METRICS = ["grad_norm", "epoch", "v_star", "reward_std", "policy_logp", "ref_logp", "num_tokens",
                 "eval_loss", "eval_reward", "clip_fraction", "entropy", "step_time"]
WORDS = ("the of and to in is was for on that with as by at from his her which an be this are or had not but what "
         "all were when we there can more if no out so said would about up them then she many some time these").split()


# ------------------------------------------------------------------ fill

def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _v_star(rewards: list[float], beta: float = 0.5) -> float:
    return beta * math.log(sum(math.exp(r / beta) for r in rewards) / len(rewards))


def fill(store: Store, prompts: int, n: int, samples: int, metrics: int, seed: int = 0,
         log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the benchmark run; returns its ids and how long each part of the fill took."""
    rng = random.Random(seed)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    spec = {"name": BENCH_RUN, "action": "train", "model": "SmolLM2-135M-Instruct",
            "dataset": {"source": "arithmetic", "num_prompts": prompts, "eval_size": 0},
            "config": {"num_value_samples": n}}
    for i in range(20):  # other, small runs: the Runs page lists them all
        other = store.create_run(f"small-{i}", "train", spec, model="SmolLM2-135M-Instruct", dataset="arithmetic")
        store.apply(other, lifecycle.CLAIM, pid=os.getpid())
        store.apply(other, lifecycle.FINISH, progress=1.0, started_at=time.time() - 600)
        store.add_metrics(other, 1, {"loss": 1.0, "reward": 0.5})
    run_id = store.create_run(BENCH_RUN, "train", spec, model="SmolLM2-135M-Instruct", dataset="arithmetic")
    value_set_id = store.get_or_create_value_set(f"bench-{prompts}-{n}-{seed}", {"bench": True})
    store.apply(run_id, lifecycle.CLAIM, pid=os.getpid(), value_set_id=value_set_id, stage="train", progress=0.5,
                started_at=time.time() - 3600)

    batch = 2000
    for first in range(0, prompts, batch):
        records = []
        for i in range(first, min(prompts, first + batch)):
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            text = f"What is {a} + {b}? {_text(rng, 8)}"
            p = rng.random() ** 2
            rewards = [1.0 if rng.random() < p else 0.0 for _ in range(n)]
            correct = int(sum(rewards))
            records.append({"prompt_id": f"p{i:07d}", "prompt": [{"role": "user", "content": text}],
                            "prompt_text": text, "v_star": _v_star(rewards), "rewards": rewards,
                            "completions": [f"{a + b + rng.randint(-1, 1)} because {_text(rng, 14)}"
                                            for _ in range(n)],
                            "num_correct": correct, "filtered": correct == 0})
        store.add_values(value_set_id, "train", records)
        store.set_run_values(run_id, "train", records)  # as the recorder writes each stage-1 batch
    store.mark_value_set_complete(value_set_id, {})
    timings["values"] = time.perf_counter() - start
    log(f"  {prompts} prompts x N={n}: {timings['values']:.1f} s")

    t0 = time.perf_counter()
    names = TRAIN_METRICS + OTHER_METRICS
    steps = max(1, metrics // len(names))
    for first in range(1, steps + 1, 500):
        with store._write() as s:  # 500 steps a transaction: what `add_metrics` does, in fewer commits
            for step in range(first, min(steps + 1, first + 500)):
                store_add_metrics(s, run_id, step, {k: rng.gauss(1.0 / math.sqrt(step), 0.1) for k in names})
    timings["metrics"] = time.perf_counter() - t0
    log(f"  {steps * len(names)} metric rows: {timings['metrics']:.1f} s")

    t0 = time.perf_counter()
    per_step = max(1, samples // steps)
    rows: list[dict[str, Any]] = []
    done = 0
    for step in range(1, steps + 1):
        for j in range(per_step):
            reward = 1.0 if rng.random() < 0.3 else 0.0
            rows.append({"step": step, "split": "train", "prompt_id": f"p{(step * per_step + j) % prompts:07d}",
                         "prompt_text": f"What is {rng.randint(10, 999)} + {rng.randint(10, 999)}?",
                         "completion": f"{rng.randint(20, 2000)} {_text(rng, 12)}", "reward": reward,
                         "v_star": rng.random(), "advantage": reward - 0.4, "implicit_reward": rng.gauss(0, 0.01),
                         "completion_length": rng.randint(4, 64)})
        if len(rows) >= 20_000 or step == steps:
            store.add_samples(run_id, rows)
            done += len(rows)
            rows = []
    timings["samples"] = time.perf_counter() - t0
    log(f"  {done} samples: {timings['samples']:.1f} s")

    t0 = time.perf_counter()
    store.add_logs(run_id, [("INFO", f"step {i}: {_text(rng, 10)}") for i in range(5000)])
    for step in range(0, steps + 1, max(1, steps // 50)):
        store.add_evaluation(run_id, step, {"eval_accuracy": rng.random(), "eval_loss": rng.random()})
    store.add_checkpoint(run_id, steps, "/tmp/bench/checkpoint")
    timings["logs"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - start
    return {"run_id": run_id, "value_set_id": value_set_id, "fill_s": timings}


def find_bench_run(store: Store) -> dict[str, Any] | None:
    runs = [r for r in store.list_runs() if r["name"] == BENCH_RUN and r.get("value_set_id")]
    return {"run_id": runs[0]["id"], "value_set_id": runs[0]["value_set_id"], "fill_s": None} if runs else None


# ------------------------------------------------------------------ operations


@dataclass
class Op:
    """One thing the dashboard does; `previous` / `current` do the store work of the old and the new dashboard."""

    group: str  # "poll", "view", "update" (work once per new data, for every session), "export"
    name: str
    previous: Callable[[], Any] | None
    current: Callable[[], Any] | None
    results: dict[str, float | None] = field(default_factory=dict)


def _previous_value_counts(store: Store) -> list[Any]:
    """How value sets were counted before `value_sets.counts`: a GROUP BY over every stored prompt."""
    with store._read() as s:
        return s.connection().exec_driver_sql(
            "SELECT value_set_id, split, count(*) FROM prompt_values GROUP BY value_set_id, split").fetchall()


def _previous_status(store: Store, run_id: int) -> dict[str, Any]:
    """How /status found the latest value per metric before `metric_latest`: every metric row of the run."""
    latest: dict[str, dict[str, Any]] = {}
    for row in store.get_metrics(run_id):
        if row["name"] not in latest or row["step"] >= latest[row["name"]]["step"]:
            latest[row["name"]] = {"step": row["step"], "value": row["value"]}
    return latest


def operations(store: Store, run_id: int, value_set_id: int, workdir: Path) -> list[Op]:
    ids = store.last_ids(run_id)
    count = store.count_values(value_set_id, "train")
    prompt_id = f"p{count // 2:07d}"
    has = lambda name: hasattr(store, name)  # noqa: E731 - the current plan needs the new read API
    ops = [
        Op("poll", "run row + what changed (get_run, last_ids)",
           lambda: (store.get_run(run_id), store.last_ids(run_id)),
           lambda: (store.get_run(run_id), store.last_ids(run_id))),
        Op("poll", "value-set counts", lambda: _previous_value_counts(store),
           lambda: store.get_value_set(value_set_id)),
        Op("poll", "list of value sets", lambda: (_previous_value_counts(store), store.list_value_sets()),
           lambda: store.list_value_sets()),
        Op("poll", "stage-1 batch arrived: V* tabs data",
           lambda: store.get_values(value_set_id, "train"),
           (lambda: (store.values_after(run_id, "train", _last_value_id(store, value_set_id) - 256),
                     store.value_stats(run_id, "train"))) if has("value_stats") else None),
        Op("poll", "new metric rows (20)", lambda: store.get_metrics(run_id, after_id=ids["metrics"] - 20),
           lambda: store.get_metrics(run_id, after_id=ids["metrics"] - 20)),
        Op("poll", "new samples (100, newest first)",
           lambda: store.get_samples(run_id, after_id=ids["samples"] - 100, limit=500, newest_first=True),
           lambda: store.get_samples(run_id, after_id=ids["samples"] - 100, limit=500, newest_first=True)),
        Op("poll", "new log lines (10)", lambda: store.get_logs(run_id, after_id=ids["logs"] - 10),
           lambda: store.get_logs(run_id, after_id=ids["logs"] - 10)),
        Op("poll", "/status", lambda: (store.get_run(run_id), _previous_status(store, run_id),
                                       store.get_value_set(value_set_id)),
           lambda: (store.get_run(run_id), store.latest_metrics(run_id), store.get_value_set(value_set_id))),
        # What /status computes once per change of the run's V* rows (then cached for every later poll).
        Op("update", "/status: the run's own V* summary", None,
           (lambda: store.value_summary(run_id)) if has("value_summary") else None),
        Op("poll", "/metrics after the newest id", lambda: store.get_metrics(run_id, after_id=ids["metrics"]),
           lambda: store.get_metrics(run_id, after_id=ids["metrics"])),
        Op("poll", "Runs page (list_runs)", store.list_runs, store.list_runs),
        Op("view", "V* tab (summary, histogram, bars, table)",
           lambda: (store.get_values(value_set_id, "train"), store.value_splits(value_set_id)),
           (lambda: (store.value_stats(run_id, "train"), store.values_page(run_id, "train", limit=200),
                     store.get_run(run_id)["value_counts"])) if has("value_stats") else None),
        Op("view", "V* table sorted by V* (descending)",
           lambda: sorted(store.get_values(value_set_id, "train"), key=lambda v: -(v["v_star"] or 0))[:200],
           (lambda: store.values_page(run_id, "train", sort="v_star", descending=True, limit=200))
           if has("values_page") else None),
        Op("view", "V* table text search",
           lambda: [v for v in store.get_values(value_set_id, "train") if "what is 123 +" in v["prompt_text"].lower()],
           (lambda: store.values_page(run_id, "train", text="What is 123 +", limit=200))
           if has("values_page") else None),
        Op("view", "Filtered tab",
           lambda: [v for v in store.get_values(value_set_id, "train") if v["filtered"]],
           (lambda: store.values_page(run_id, "train", filtered=True, limit=200))
           if has("values_page") else None),
        Op("view", "one prompt's completions",
           lambda: next(v for v in store.get_values(value_set_id, "train") if v["prompt_id"] == prompt_id),
           (lambda: store.get_value(run_id, "train", prompt_id)) if has("get_value") else None),
        Op("view", "Training tab (metric series)", lambda: store.get_metrics(run_id),
           (lambda: store.metric_series(run_id, TRAIN_METRICS, max_points=1000))
           if has("metric_series") else None),
        Op("view", "Samples tab (500 newest)",
           lambda: store.get_samples(run_id, limit=500, newest_first=True),
           (lambda: store.get_samples(run_id, limit=500, newest_first=True))),
        Op("view", "Samples tab, text filter (no match)",
           lambda: store.get_samples(run_id, limit=500, newest_first=True, text="because"),
           (lambda: store.get_samples(run_id, after_id=max(0, ids["samples"] - 100_000), limit=500,
                                      newest_first=True, text="because"))),
        Op("view", "Logs tab (300 newest)", lambda: store.get_logs(run_id, after_id=max(0, ids["logs"] - 300)),
           lambda: store.get_logs(run_id, after_id=max(0, ids["logs"] - 300))),
    ]
    for table in ("values", "samples", "metrics"):
        ops.append(Op("export", f"CSV export: {table}", _export_call("previous", table, store, run_id, workdir),
                      _export_call("current", table, store, run_id, workdir)))
    return ops


def _last_value_id(store: Store, value_set_id: int) -> int:
    with store._read() as s:
        return s.execute(text("SELECT max(id) FROM prompt_values WHERE value_set_id = :id"),
                         {"id": value_set_id}).scalar() or 0


def _export_call(plan: str, table: str, store: Store, run_id: int, workdir: Path) -> Callable[[], Any]:
    return lambda: export(plan, table, store, run_id, workdir / f"{plan}-{table}.csv")


def export(plan: str, table: str, store: Store, run_id: int, path: Path) -> int:
    """Write one CSV export as the previous or the current dashboard does; returns the file's size."""
    from storage.export import export_csv

    run = store.get_run(run_id)
    if plan == "previous":
        rows = {"values": lambda: store.get_values(run["value_set_id"], split=None),
                "samples": lambda: store.get_samples(run_id, limit=None),
                "metrics": lambda: store.get_metrics(run_id)}[table]()
        path.write_text(export_csv(rows))
    else:
        iterate = {"values": lambda: store.iter_values(run_id, split=None),
                   "samples": lambda: store.iter_samples(run_id),
                   "metrics": lambda: store.iter_metrics(run_id)}[table]
        export_csv(iterate(), path)
    return path.stat().st_size


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _export_child(db: str, plan: str, table: str, run_id: int, path: str, queue) -> None:
    store = Store(db)
    store.get_run(run_id)  # connections open before the baseline
    before = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    size = export(plan, table, store, run_id, Path(path))
    queue.put({"seconds": time.perf_counter() - t0, "peak_mib": (_rss_kib("VmHWM") - before) / 1024,
               "bytes": size})


def measure_export(db: str, plan: str, table: str, run_id: int, workdir: Path) -> dict[str, float]:
    """Time and peak memory of one export, in a fresh process (so earlier work does not hide its peak)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_export_child, args=(str(db), plan, table, run_id,
                                                   str(workdir / f"{plan}-{table}.csv"), queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm: the page cache and the connection, as a dashboard that has been running
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


# ------------------------------------------------------------------ the dashboard's own handlers (--app)


def app_operations(store: Store, run_id: int, value_set_id: int) -> list[Op]:
    """The Run page's handlers end to end (store reads, figures and tables, Gradio's serialisation of them), as
    the first session to open a view meets them (`live.SHARED` emptied before each call), and a poll that finds
    nothing new. Imported lazily: the storage package does not depend on the app."""
    import gradio as gr
    import pandas as pd
    import plotly.graph_objects as go

    from app.access.gate import Services
    from app.web import live
    from app.web.pages.run import frame, poller, session, views

    services = Services(store=store, scheduler=None, data_dir=Path(tempfile.gettempdir()))
    table, plot = gr.Dataframe(render=False), gr.Plot(render=False)
    inputs = (frame.ChartOptions(), "train", "stage-1 order", "", "all", "", "")
    prompt_id = f"p{store.count_values(value_set_id, 'train') // 2:07d}"

    def serialise(outputs: list[Any]) -> None:
        for value in outputs:
            if isinstance(value, pd.DataFrame):
                table.postprocess(value)
            elif isinstance(value, (go.Figure, gr.components.plot.PlotData)):
                plot.postprocess(value)

    def open_view(tab: str, cold: bool = True) -> Callable[[], Any]:
        def call() -> None:
            if cold:
                live.SHARED.forget(lambda _key: True)
            serialise(session.refresh(services, run_id, session.new_state(run_id, tab), *inputs))
        return call

    warm_state: dict[str, Any] = {}

    def poll_unchanged() -> None:
        if "state" not in warm_state:
            warm_state["state"] = session.refresh(services, run_id, None, *inputs)[0]
        serialise(session.refresh(services, run_id, warm_state["state"], *inputs))

    def after_batch() -> None:
        """A stage-1 batch arrived: new V* aggregates, page and charts (once, for every session)."""
        state = session.refresh(services, run_id, None, *inputs)[0]
        live.SHARED.forget(lambda key: key[0] in ("stats", "values", "page"))
        for view in ("summary", "charts", "table"):
            state["shown"].pop(view)
        serialise(session.refresh(services, run_id, state, *inputs))

    def click_prompt() -> None:
        from app.web.pages import values

        serialise([values.prompt_detail(store.get_value(run_id, "train", prompt_id), prompt_id)[1]])

    def version() -> None:
        """What a page's timer asks every 2.5 s (`/run_version`), the snapshot re-read (as once a second)."""
        live.SHARED.forget(lambda key: key[0] == "snapshot")
        poller.run_version(store, run_id)

    ops = [Op("poll", "app: /run_version (each page's poll, every 2.5 s)", None, version),
           Op("poll", "app: a redraw that finds nothing new", None, poll_unchanged),
           Op("update", "app: redraw after a stage-1 batch (V* tab; once for all sessions)", None, after_batch)]
    for tab in views.TABS:
        ops.append(Op("view", f"app: open the {tab} tab (first session)", None, open_view(tab)))
    ops.append(Op("view", "app: open the V* tab (later sessions)", None, open_view("values", cold=False)))
    ops.append(Op("view", "app: click one prompt", None, click_prompt))
    return ops


# ------------------------------------------------------------------ report


def target(group: str) -> str:
    limit = {"poll": POLL_TARGET_MS, "view": VIEW_TARGET_MS, "update": VIEW_TARGET_MS}.get(group)
    return f"<= {limit:.0f} ms" if limit else "streamed"


def markdown(ops: list[Op], plans: list[str]) -> str:
    head = ["kind", "dashboard operation", "target"] + [f"{p} ms" for p in plans]
    if any(op.group == "export" for op in ops):
        head += [f"{p} peak MiB" for p in plans]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for op in ops:
        cells = [op.group, op.name, target(op.group)]
        for plan in plans:
            value = op.results.get(f"{plan}_ms")
            limit = {"poll": POLL_TARGET_MS, "view": VIEW_TARGET_MS, "update": VIEW_TARGET_MS}.get(op.group)
            text = "–" if value is None else f"{value:,.1f}"
            cells.append(f"**{text}**" if value is not None and limit and value > limit else text)
        if "export" in {o.group for o in ops}:
            for plan in plans:
                mib = op.results.get(f"{plan}_mib")
                cells.append("" if mib is None else f"{mib:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def size_mib(store: Store) -> float:
    """The database's size on disk: the SQLite file, or the PostgreSQL database."""
    if store.path is not None:
        return store.path.stat().st_size / 2**20
    from sqlalchemy import create_engine, text

    engine = create_engine(store.url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT pg_database_size(current_database())")).scalar() / 2**20
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=8, help="reference samples (completions) per prompt")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--metrics", type=int, default=200_000)
    parser.add_argument("--db", default=None, help="database file or server URL (default: a temporary file)")
    parser.add_argument("--keep", action="store_true", help="keep the database (reused by a later run)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plan", choices=["previous", "current", "both"], default="both")
    parser.add_argument("--only", default=None, help="time only operations whose name contains this text")
    parser.add_argument("--no-exports", action="store_true", help="skip the CSV exports (slow at full size)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--app", action="store_true", help="also time the Run page's handlers (imports the app)")
    args = parser.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="storage-bench-")
    db = args.db or str(Path(tmp) / "bench.db")
    store = Store(db)
    found = find_bench_run(store)
    if found is None:
        print(f"Filling {db} ...", flush=True)
        found = fill(store, args.prompts, args.n, args.samples, args.metrics, log=lambda m: print(m, flush=True))
        print(f"Filled in {found['fill_s']['total']:.1f} s; size {size_mib(store):,.0f} MiB.", flush=True)
    else:
        print(f"Reusing the benchmark run in {db} ({size_mib(store):,.0f} MiB).", flush=True)
    run_id, value_set_id = found["run_id"], found["value_set_id"]
    plans = ["previous", "current"] if args.plan == "both" else [args.plan]
    workdir = Path(tmp)
    ops = [op for op in operations(store, run_id, value_set_id, workdir)
           if (args.only is None or args.only in op.name) and not (args.no_exports and op.group == "export")]
    if args.app:
        ops += [op for op in app_operations(store, run_id, value_set_id) if args.only is None or args.only in op.name]
    for op in ops:
        for plan in plans:
            fn = getattr(op, plan)
            if fn is None:
                continue
            try:
                if op.group == "export":
                    result = measure_export(db, plan, op.name.rsplit(" ", 1)[-1], run_id, workdir)
                    op.results[f"{plan}_ms"], op.results[f"{plan}_mib"] = result["seconds"] * 1000, result["peak_mib"]
                else:
                    op.results[f"{plan}_ms"] = median_ms(fn, args.repeats)
            except AttributeError as error:  # a plan that needs methods this Store lacks
                print(f"  {op.name} ({plan}): skipped, {error}", file=sys.stderr)
                continue
            print(f"  {op.name} ({plan}): {op.results[f'{plan}_ms']:,.1f} ms", flush=True)
    print()
    print(f"python -m benchmarks.store ({store.dialect}): {args.prompts} prompts x N={args.n}, {args.samples} "
          f"samples, {args.metrics} metric rows; median of {args.repeats} (exports: one run each, peak RSS above "
          "the start)")
    print(markdown(ops, plans))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "fill_s": found["fill_s"],
                                         "ops": [{"group": o.group, "name": o.name, **o.results} for o in ops]},
                                        indent=1))
    for leftover in Path(tmp).glob("*.csv"):
        leftover.unlink()
    if args.db is None and not args.keep:
        store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
