"""Time from Launch to the first V* rows: local workers (SQLite) against Ray jobs (PostgreSQL), side by side.

    python scripts/ray_latency.py [--trials 5]

Starts a one-node Ray cluster on 127.0.0.1 unless one answers at http://127.0.0.1:8265 (as the tests do), a
throwaway PostgreSQL server (`tests/postgres.py`), and two studios on a tiny random-init model: one with the
default local backend, one with `--ray-address`. Each trial launches the same tiny run (a new dataset seed per trial,
so stage 1 always samples) on each through `/launch`, times until the run's first V* row is in its store, then
deletes it. Prints the median and every trial; the figures go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `benchmarks`, `tests`

DASHBOARD = "http://127.0.0.1:8265"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def first_values_after_launch(client, store, spec: dict) -> float:
    """Seconds from the /launch call to the run's first stored V* row; the run is deleted afterwards."""
    started = time.perf_counter()
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    while True:
        run = store.get_run(run_id)
        if sum((run.get("value_counts") or {}).values()) > 0:
            elapsed = time.perf_counter() - started
            break
        if run["status"] in ("failed", "stopped"):
            raise RuntimeError(f"run {run_id} {run['status']}: {run['error']}")
        time.sleep(0.05)
    client.predict(run_id=run_id, api_name="/delete")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()

    import subprocess
    import urllib.request

    from gradio_client import Client

    from a2po.testing import make_tiny_model
    from benchmarks.harness import studio
    from storage import Store
    from tests import postgres
    from tests.web.test_app_api import tiny_spec

    def ray_answers() -> bool:
        try:
            with urllib.request.urlopen(f"{DASHBOARD}/api/version", timeout=2):
                return True
        except OSError:
            return False

    binaries = postgres.find_binaries()
    if binaries is None:
        raise SystemExit(postgres.MISSING)
    ray = Path(sys.executable).parent / "ray"
    with contextlib.ExitStack() as cleanup:  # undone last to first: the studios, the database, the Ray head
        if not ray_answers():
            subprocess.run([str(ray), "start", "--head", "--port=6379", "--dashboard-host=127.0.0.1",
                            "--dashboard-port=8265", "--num-cpus=2", "--include-dashboard=true",
                            "--object-store-memory=200000000", "--disable-usage-stats"], check=True,
                           capture_output=True)
            cleanup.callback(subprocess.run, [str(ray), "stop", "--force"], capture_output=True)
            while not ray_answers():
                time.sleep(0.5)
        server = postgres.PostgresServer(binaries).start()
        cleanup.callback(server.stop)
        work = Path(tempfile.mkdtemp(prefix="a2po-ray-latency-"))
        model = work / "tiny-model"
        make_tiny_model(model)
        db = server.create_database()
        local = cleanup.enter_context(studio(work / "local", "--model-root", str(model), env=OFFLINE))
        on_ray = cleanup.enter_context(studio(work / "ray", "--model-root", str(model), "--ray-address", DASHBOARD,
                                              "--db", db, env=OFFLINE))
        backends = {"local": (Client(local.url, verbose=False), Store(work / "local" / "studio.db")),
                    "ray": (Client(on_ray.url, verbose=False), Store(db))}
        times: dict[str, list[float]] = {name: [] for name in backends}
        for trial in range(args.trials):
            for name, (client, store) in backends.items():
                spec = tiny_spec(str(model), f"latency-{name}-{trial}")
                spec["dataset"]["seed"] = trial
                times[name].append(first_values_after_launch(client, store, spec))
                print(f"trial {trial + 1}: {name} {times[name][-1]:.2f} s", flush=True)
        print(f"\nLaunch -> first V* rows (median of {args.trials}): "
              + ", ".join(f"{name} {statistics.median(t):.2f} s" for name, t in times.items()))
        for name, t in times.items():
            print(f"  {name}: " + " ".join(f"{x:.2f}" for x in t))


if __name__ == "__main__":
    main()
