"""Chunked runs under load: every chunk runs in a forked copy of a process whose other threads keep reading and
writing the database, while two busy loops take the CPUs. No forked process may touch SQLite (`app.runtime.journal`):
each run must end with the losses of the same run in one worker process, and the database must stay intact.

`A2PO_STRESS_RUNS` runs of each mode (default 2: the CI profile; `make stress` runs 20):
- forked mode, through the app (`python -m app --chunk-seconds 0.5`) with a client polling its API;
- ZeroGPU mode, with the fake `spaces` package (each `@spaces.GPU` call in a freshly forked process, as ZeroGPU runs
  it) and the Run page's driver (`app.runtime.zerogpu.ChunkDriver`), while threads of the same process serve the API's
  status and list reads as Gradio's do.
"""

from __future__ import annotations

import functools
import importlib
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import helpers
from tests.runtime.test_chunks import FAKE_SPACES, assert_same, chunk_spec, reference, taught_model  # noqa: F401
from tests.runtime.test_durability import make_manager, record
from tests.web.test_app_api import free_port, start_app, stop_app

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.serial]
RUNS = int(os.environ.get("A2PO_STRESS_RUNS", "2"))
wait_for = functools.partial(helpers.wait_for, poll=0.2)


@pytest.fixture
def busy_cpus():
    """Two processes that keep both cores busy for the test's whole length."""
    with helpers.busy_cpus():
        yield


def integrity(path: Path) -> str:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


def forget_value_set(path: Path, value_set_id: int) -> None:
    """Hide a V* set from later runs, as if they ran in a new studio (the studio itself never deletes one): the next
    run with the same settings makes a set of its own and samples its V* again."""
    con = sqlite3.connect(path, timeout=60)
    try:
        with con:
            con.execute("UPDATE value_sets SET fingerprint = fingerprint || '-forgotten-' || id WHERE id = ?",
                        (value_set_id,))
    finally:
        con.close()


class Poller(threading.Thread):
    """Calls `read()` in a loop until stopped, counting calls and keeping the first error."""

    def __init__(self, read) -> None:
        super().__init__(daemon=True)
        self.read, self.calls, self.error = read, 0, None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.read()
                self.calls += 1
            except Exception as error:  # noqa: BLE001 - reported by the test
                self.error = self.error or error
            time.sleep(0.05)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=30)


def test_forked_chunks_under_load_end_like_one_worker(tmp_path, taught_model, busy_cpus):  # noqa: F811
    from gradio_client import Client

    from storage import Store

    port = free_port()
    proc = start_app(tmp_path / "studio", port, "--model-root", taught_model, "--chunk-seconds", "0.5")
    store = None
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        current = {"run": None}
        poller = Poller(lambda: (client.predict(api_name="/list_runs"), current["run"] and
                                 client.predict(run_id=current["run"], api_name="/status")))
        poller.start()
        store = Store(tmp_path / "studio" / "studio.db")
        # The same run in one worker process, through the same API (which completes a spec from its preset).
        worker = client.predict(spec=chunk_spec(taught_model, "worker", runner="worker"), api_name="/launch")
        run = helpers.wait_status(store, worker["run_id"], ("finished", "failed"), timeout=400)
        assert run["status"] == "finished", run["error"]
        reference = record(store, worker["run_id"])
        for i in range(RUNS):
            run_id = client.predict(spec=chunk_spec(taught_model, f"forked-{i}"), api_name="/launch")["run_id"]
            current["run"] = run_id
            run = helpers.wait_status(store, run_id, ("finished", "failed", "stopped"), timeout=400)
            assert run["status"] == "finished", (i, run["error"])
            assert run["chunks_done"] >= 4
            assert_same(record(store, run_id), reference)
            forget_value_set(store.path, run["value_set_id"])  # the next run samples its V* again, chunk by chunk
        poller.stop()
        assert poller.error is None and poller.calls > RUNS
    finally:
        if store is not None:
            store.close()
        stop_app(proc)
    assert integrity(tmp_path / "studio" / "studio.db") == "ok"


def test_zerogpu_chunks_under_load_end_like_one_worker(tmp_path, taught_model, reference, busy_cpus,  # noqa: F811
                                                       monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_SPACES))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    monkeypatch.delitem(sys.modules, "app.runtime.zerogpu", raising=False)
    zerogpu = importlib.import_module("app.runtime.zerogpu")
    try:
        import spaces

        assert getattr(spaces, "FAKE", False)  # each call in a freshly forked process
        from app.access.gate import Services

        store, manager = make_manager(tmp_path / "data", zerogpu=True, chunk_seconds=0.5)
        services = Services(store=store, scheduler=manager, data_dir=tmp_path / "data")
        manager.start()  # the scheduler thread: it pauses runs no page drives, and supervises
        driver = zerogpu.ChunkDriver(services)
        current = {"run": None}
        # What the API's /list_runs and /status read, from threads of this process, as Gradio's serve them.
        readers = [Poller(lambda: [store.latest_metrics(r["id"]) for r in store.list_runs()]),
                   Poller(lambda: current["run"] and driver.status(current["run"]))]
        for reader in readers:
            reader.start()
        for i in range(RUNS):
            run_id = manager.submit(chunk_spec(taught_model, f"zerogpu-{i}"))
            current["run"] = run_id
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline:  # the Run page's ticks, one chunk per call
                info = driver.drive(run_id)
                if info["status"] not in ("queued", "paused", "running"):
                    break
                time.sleep(0.05)
            run = store.get_run(run_id)
            assert run["status"] == "finished", (i, run["error"], [x["message"] for x in store.get_logs(run_id)][-8:])
            assert_same(record(store, run_id), reference)
            forget_value_set(store.path, run["value_set_id"])  # the next run samples its V* again, chunk by chunk
        for reader in readers:
            reader.stop()
            assert reader.error is None and reader.calls > RUNS
        manager.close()
        assert integrity(store.path) == "ok"
    finally:
        monkeypatch.delitem(sys.modules, "spaces", raising=False)
        monkeypatch.delitem(sys.modules, "app.runtime.zerogpu", raising=False)
