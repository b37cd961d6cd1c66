"""What watching a run costs: the dashboard's CPU (and memory) while pages poll it.

    python -m benchmarks.polling_cost                      # every measurement, 60 s windows
    python -m benchmarks.polling_cost --window 30 --only idle,page-live --prompts 20000

Starts `python -m app` on a fresh data folder holding a finished run (stage 1 done, a trained curve, samples) and a
live one whose worker is simulated: a process registered as that run's worker (so the studio supervises it like a
real one) that writes what a worker writes every `--interval` seconds: in stage 1 a batch of V* rows (N = 8
completions each), in stage 2 a step of metrics, a few samples, a log line and an evaluation now and then.

Measured over a fixed window from /proc/<pid>/stat (utime + stime, all threads), as % of one core:

- idle: the app with no page open (no run active; then with the live run active);
- page-live: one real Chromium page on the live run (stage 1 on the V* tab, stage 2 on the Training tab), the app
  and every Chromium process, against the same window with no page open;
- page-finished: 1 and 4 Chromium pages open on the finished run;
- sessions: `--sessions` Gradio clients (gradio_client) each making the calls of a Run page on the V* tab, on the
  live run in stage 1 and in stage 2: `/run_version` every 2.5 s (what its timer's poller asks) and, for each group
  of views on screen that moved, `/run_draw_<group>`, at most every 5 s (see `app.web.pages.run`).

The app's RSS is sampled through every window (start, end, max). The worker simulator and this script are not
counted. Prints a markdown table; `--json` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the simulated worker runs this file as a script

from app.runtime.data_folder import DataFolder  # noqa: E402
from benchmarks.harness import CHROMIUM, CHROMIUM_ARGS, studio  # noqa: E402
from storage import Store, lifecycle  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
N = 8
TRAIN_METRICS = ["loss", "reward", "advantage", "implicit_reward", "log_ratio", "completion_length",
                 "learning_rate", "grad_norm"]
SPEC = {"action": "train", "model": "SmolLM2-135M-Instruct", "rewards": [{"name": "exact_match", "weight": 1.0}]}


# ------------------------------------------------------------------ data


def value_records(rng: random.Random, first: int, count: int) -> list[dict]:
    out = []
    for i in range(first, first + count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        p = rng.random() ** 2
        rewards = [1.0 if rng.random() < p else 0.0 for _ in range(N)]
        correct = int(sum(rewards))
        out.append({"prompt_id": f"q{i:07d}", "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                    "prompt_text": f"What is {a} + {b}?", "rewards": rewards, "num_correct": correct,
                    "v_star": 0.5 * math.log(sum(math.exp(r / 0.5) for r in rewards) / N), "filtered": correct == 0,
                    "completions": [f"{a + b + rng.randint(-1, 1)} is the answer" for _ in range(N)]})
    return out


def train_step(store: Store, run_id: int, step: int, rng: random.Random) -> None:
    store.add_metrics(run_id, step, {k: rng.gauss(1 / math.sqrt(step), 0.05) for k in TRAIN_METRICS})
    store.add_samples(run_id, [{"step": step, "prompt_id": f"q{step * 8 + j:07d}", "prompt_text": "What is 1 + 1?",
                                "completion": f"{rng.randint(1, 3)}", "reward": float(rng.random() < 0.4),
                                "v_star": 0.3, "advantage": 0.1, "implicit_reward": 0.01, "completion_length": 2}
                               for j in range(8)])
    if step % 10 == 0:
        store.add_evaluation(run_id, step, {"eval_accuracy": min(1.0, step / 500), "eval_loss": 1 / step})


def build(data_dir: Path, prompts: int, steps: int) -> dict[str, int]:
    """A finished run (stage 1 of `prompts` prompts, `steps` training steps) and the live run (not started)."""
    store = Store(data_dir / "studio.db")
    rng = random.Random(0)
    done = store.create_run("finished-run", "train", {**SPEC, "name": "finished-run"}, model=SPEC["model"],
                            dataset="arithmetic")
    vs = store.get_or_create_value_set("finished", {})
    store.update_run(done, value_set_id=vs)
    for first in range(0, prompts, 2000):
        records = value_records(rng, first, min(2000, prompts - first))
        store.add_values(vs, "train", records)
        store.set_run_values(done, "train", records)
    store.mark_value_set_complete(vs, {})
    for step in range(1, steps + 1):
        train_step(store, done, step, rng)
    store.add_logs(done, [("INFO", f"line {i}") for i in range(300)])
    store.apply(done, lifecycle.CLAIM, pid=os.getpid(), started_at=time.time() - 3600)
    store.apply(done, lifecycle.FINISH, value_set_id=vs, stage=None, progress=1.0)
    live = store.create_run("live-run", "train", {**SPEC, "name": "live-run"}, model=SPEC["model"],
                            dataset="arithmetic")
    live_vs = store.get_or_create_value_set("live", {})
    # Stopped until its simulated worker takes it (a queued run would get a real worker from the scheduler).
    store.apply(live, lifecycle.CANCEL, value_set_id=live_vs, progress=0.0)
    store.close()
    return {"finished": done, "live": live, "live_vs": live_vs}


# ------------------------------------------------------------------ the simulated worker


def simulate(db: str, run_id: int, value_set_id: int, stage: str, interval: float) -> None:
    """Write into `run_id` what a worker writes, every `interval` seconds, until SIGTERM."""
    store = Store(db)
    rng = random.Random(os.getpid())
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    store.apply(run_id, lifecycle.RESUME)
    if not store.apply(run_id, lifecycle.CLAIM, stage=stage, pid=os.getpid()):
        store.update_run(run_id, stage=stage, pid=os.getpid())  # takes over from the simulator of the last stage
    step = max([0, *[m["step"] for m in store.latest_metrics(run_id).values()]])
    done = store.count_values(value_set_id, "train")
    while not stopping.wait(interval):
        if stage == "values":
            records = value_records(rng, done, 64)
            store.add_values(value_set_id, "train", records)
            store.set_run_values(run_id, "train", records)
            done += 64
            store.add_log(run_id, f"stage 1: {done} prompts")
            store.heartbeat(run_id, progress=min(1.0, done / 100_000), progress_at=time.time())
        else:
            step += 1
            train_step(store, run_id, step, rng)
            store.add_log(run_id, f"step {step}: loss {rng.random():.3f}")
            store.heartbeat(run_id, progress=min(1.0, step / 10_000), progress_at=time.time())


class Worker:
    """The simulator as a process the studio takes for `app.runtime.worker` of the run: its command line says so, and
    it works where the studio's workers work (a process elsewhere is another studio's)."""

    def __init__(self, db: Path, ids: dict[str, int], stage: str, interval: float) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "simulate", str(db), str(ids["live"]),
                                      str(ids["live_vs"]), stage, str(interval), "app.runtime.worker", "--run-id",
                                      str(ids["live"])], cwd=DataFolder(db.parent).make_worker_cwd())
        store = Store(db)
        deadline = time.monotonic() + 60
        while store.get_run(ids["live"])["pid"] != self.proc.pid and time.monotonic() < deadline:
            time.sleep(0.1)
        store.close()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


# ------------------------------------------------------------------ measuring


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError):
            pass
    return total / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def chromium_pids() -> list[int]:
    """Every Chromium process started below this script (browser, renderers, GPU and utility processes)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
            parents[int(entry)] = int(text.rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                names[int(entry)] = f.read().split(b"\0")[0].decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    me, out = os.getpid(), []
    for pid in parents:
        ancestor, depth = parents.get(pid), 0
        while ancestor and ancestor != me and depth < 20:
            ancestor, depth = parents.get(ancestor), depth + 1
        if ancestor == me and "chrom" in names.get(pid, ""):
            out.append(pid)
    return out


def measure(app_pid: int, window: float, with_chromium: bool = False) -> dict[str, float]:
    """% of one core used by the app (and by Chromium) over `window` seconds, and the app's RSS through it."""
    browser = chromium_pids() if with_chromium else []
    rss = [rss_mib(app_pid)]
    t0, app0, chrome0 = time.monotonic(), cpu_seconds([app_pid]), cpu_seconds(browser)
    while (left := window - (time.monotonic() - t0)) > 0:
        time.sleep(min(5.0, left))
        rss.append(rss_mib(app_pid))
    elapsed = time.monotonic() - t0
    return {"app_pct": 100 * (cpu_seconds([app_pid]) - app0) / elapsed,
            "chromium_pct": 100 * (cpu_seconds(browser) - chrome0) / elapsed if with_chromium else 0.0,
            "rss_start": rss[0], "rss_end": rss[-1], "rss_max": max(rss), "seconds": elapsed}


def machine_load() -> float:
    return os.getloadavg()[0]


# ------------------------------------------------------------------ the app, pages and clients


APP_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def open_run_page(context, url: str, run_name: str, tab: str):
    """A page showing the Run page of `run_name` on `tab` (opened from the Runs page, as a user does)."""
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url, wait_until="load")
    page.wait_for_selector("#main-tabs")
    page.get_by_role("tab", name="Runs", exact=True).first.click()
    page.locator("#runs-table").get_by_text(run_name, exact=True).filter(visible=True).first.click()
    page.locator("#run-header").get_by_text(run_name).wait_for()
    if tab != "V*":
        page.get_by_role("tab", name=tab, exact=True).first.click()
    return page


def poll_clients(url: str, run_id: int, sessions: int, stop: threading.Event, errors: list[str],
                 counts: dict[str, int]) -> list:
    """`sessions` Gradio clients, each doing what a Run page on the V* tab does
    (`app.web.pages.run.poller.POLLER_JS`): every `POLL_SECONDS` (staggered) ask `/run_version`, and when some group
    on screen moved call its `/run_draw_<group>` with the page's inputs, at most every `LIVE_REDRAW_SECONDS` unless
    the status changed. Each client is its own session."""
    from gradio_client import Client

    from app.web.pages.run.poller import LIVE_REDRAW_SECONDS, POLL_SECONDS

    # In the order of the page's `draw_inputs` (`app.web.pages.run.page`).
    inputs = (run_id, 0.6, "step", False, "train", "stage-1 order", "", "all", "", "")
    on_screen = ("head", "controls", "values", "table")  # the V* tab, in stage-1 order

    def versions(client: Client) -> dict[str, str]:
        found = client.predict(run_id, api_name="/run_version")
        counts["version"] += 1
        return {**found, "table": found["table_first"]}

    def session(i: int) -> None:
        try:
            client = Client(url, verbose=False, download_files=False)
            for group in on_screen:  # the page opened
                client.predict(*inputs, api_name=f"/run_draw_{group}")
            seen, drawn = versions(client), time.monotonic()
            stop.wait(POLL_SECONDS * i / sessions)
            while not stop.is_set():
                started = time.monotonic()
                found = versions(client)
                if found["status"] != seen["status"] or started - drawn >= LIVE_REDRAW_SECONDS:
                    due = [group for group in on_screen if found[group] != seen[group]]
                    for group in due:
                        if group != "head" or "values" not in due:  # the values group redraws the header too
                            client.predict(*inputs, api_name=f"/run_draw_{group}")
                            counts["draw"] += 1
                    seen, drawn = found, started
                stop.wait(max(0.0, POLL_SECONDS - (time.monotonic() - started)))
        except Exception as error:  # noqa: BLE001 - reported, not fatal
            errors.append(repr(error))

    threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(sessions)]
    for t in threads:
        t.start()
    return threads


# ------------------------------------------------------------------ main


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "simulate":
        db, run_id, vs, stage, interval = sys.argv[2:7]
        simulate(db, int(run_id), int(vs), stage, float(interval))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=60.0, help="seconds each measurement lasts")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait before each measurement")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.5, help="seconds between two writes of the worker")
    parser.add_argument("--prompts", type=int, default=20_000, help="V* prompts of the finished run")
    parser.add_argument("--steps", type=int, default=2000, help="training steps of the finished run")
    parser.add_argument("--only", default="idle,page-live,page-finished,sessions")
    parser.add_argument("--port", type=int, default=None, help="the studio's port (default: a free one)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    only = set(args.only.split(","))

    data_dir = Path(tempfile.mkdtemp(prefix="polling-cost-"))
    t0 = time.monotonic()
    ids = build(data_dir, args.prompts, args.steps)
    print(f"data: {data_dir} ({time.monotonic() - t0:.0f} s to fill)", flush=True)
    rows: list[dict] = []
    worker = None

    def record(name: str, result: dict, **extra) -> None:
        result = {"measurement": name, **result, **extra, "load": machine_load()}
        rows.append(result)
        print(f"{name}: app {result['app_pct']:.1f}% chromium {result['chromium_pct']:.1f}% rss "
              f"{result['rss_start']:.0f}->{result['rss_end']:.0f} (max {result['rss_max']:.0f}) MiB "
              f"load {result['load']:.2f} {extra or ''}", flush=True)

    def with_worker(stage: str) -> None:
        """(Re)start the simulated worker in `stage`; the new one takes the run over before the old one stops."""
        nonlocal worker
        old, worker = worker, Worker(data_dir / "studio.db", ids, stage, args.interval)
        if old is not None:
            old.stop()

    with studio(data_dir, "--no-resume", port=args.port, env=APP_ENV) as app:
        url = app.url
        try:
            time.sleep(args.settle)
            if "idle" in only:
                record("idle app, no page, no active run", measure(app.process.pid, args.window))
            for stage, tab in (("values", "V*"), ("train", "Training")):
                with_worker(stage)
                time.sleep(args.settle)
                if "idle" in only or "page-live" in only:
                    record(f"no page, live run in stage {'1' if stage == 'values' else '2'}",
                           measure(app.process.pid, args.window))
                if "page-live" in only:
                    import playwright.sync_api as playwright

                    with playwright.sync_playwright() as p:
                        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                        context = browser.new_context(viewport={"width": 1400, "height": 900})
                        open_run_page(context, url, "live-run", tab)
                        time.sleep(args.settle)
                        record(f"1 page on the live run, stage {'1' if stage == 'values' else '2'} ({tab} tab)",
                               measure(app.process.pid, args.window, with_chromium=True))
                        browser.close()
                if "sessions" in only:
                    stop, errors, counts = threading.Event(), [], {"version": 0, "draw": 0}
                    threads = poll_clients(url, ids["live"], args.sessions, stop, errors, counts)
                    time.sleep(args.settle + 5)
                    before = dict(counts)
                    result = measure(app.process.pid, args.window)
                    record(f"{args.sessions} client sessions polling the live run, stage "
                           f"{'1' if stage == 'values' else '2'}", result, errors=len(errors),
                           polls=counts["version"] - before["version"], draws=counts["draw"] - before["draw"])
                    stop.set()
                    for t in threads:
                        t.join(30)
                    if errors:
                        print("client errors:", errors[:3], flush=True)
            if worker is not None:
                worker.stop()
                worker = None
                Store(data_dir / "studio.db").apply(ids["live"], lifecycle.FINISH)
            if "page-finished" in only:
                import playwright.sync_api as playwright

                with playwright.sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    pages = [open_run_page(context, url, "finished-run", "V*")]
                    time.sleep(args.settle)
                    record("1 page on a finished run", measure(app.process.pid, args.window, with_chromium=True))
                    pages += [open_run_page(context, url, "finished-run", "V*") for _ in range(3)]
                    time.sleep(args.settle)
                    record("4 pages on a finished run", measure(app.process.pid, args.window, with_chromium=True))
                    browser.close()
                time.sleep(args.settle)
                record("idle app after the pages closed", measure(app.process.pid, args.window))
        finally:
            if worker is not None:
                worker.stop()
    print("\n| measurement | app % of a core | Chromium % | app RSS MiB (start -> end, max) | 1-min load |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        chrome = f"{r['chromium_pct']:.1f}" if "page" in r["measurement"] else "–"
        print(f"| {r['measurement']} | {r['app_pct']:.1f} | {chrome} | {r['rss_start']:.0f} -> {r['rss_end']:.0f}, "
              f"{r['rss_max']:.0f} | {r['load']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
