"""The studio on a PostgreSQL server (`--db postgresql+psycopg://...`, docs/cluster.md): one scheduler per database
by an advisory lock that dies with its holder, workers that write to the server, and the same run as on SQLite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from app.runtime.scheduler import AlreadyServing, Devices, JobManager
from storage import Store, lifecycle
from tests.helpers import wait_for
from tests.test_durability import durable_spec, free_port, record, wait_status


def manager_on(url: str, data_dir, **options) -> tuple[Store, JobManager]:
    store = Store(url)
    return store, JobManager(store, data_dir, devices=Devices(), poll_interval=0.1,
                             worker_env=dict(os.environ), **options)


def test_one_scheduler_per_database(postgres_server, tmp_path):
    url = postgres_server.create_database()
    store, first = manager_on(url, tmp_path / "one")
    first.start(address="http://127.0.0.1:1")
    _, second = manager_on(url, tmp_path / "two")  # another data folder: the database is what is shared
    with pytest.raises(AlreadyServing, match=rf"already serving the database .*pid {os.getpid()} http://127.0.0.1:1"):
        second.start()
    # A real second app says so and exits.
    app = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path / "three"), "--db", url,
                          "--port", str(free_port())], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1"))
    assert app.returncode == 1 and "Another A*-PO Studio is already serving the database" in app.stderr, app.stderr
    first.close()
    second.start()
    second.close()
    # Another database of the same server is another studio's.
    _, other = manager_on(postgres_server.create_database(), tmp_path / "four")
    first.start()
    other.start()
    other.close()
    first.close()
    store.close()


def test_a_killed_studio_leaves_the_lock_free(postgres_server, tmp_path):
    url = postgres_server.create_database()
    Store(url).close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from storage import Store
        lock = Store({url!r}).scheduler_lock()
        lock.acquire()
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = Store(url).scheduler_lock(AlreadyServing)
        with pytest.raises(AlreadyServing):
            lock.acquire()
        holder.send_signal(signal.SIGKILL)  # no release: the server drops the lock with the connection
        holder.wait(30)
        wait_for(lambda: _try(lock), 30, "the lock of a killed studio")
        assert lock.held
        lock.release()
        assert not lock.held
    finally:
        holder.kill()


def _try(lock) -> bool:
    try:
        lock.acquire()
        return True
    except AlreadyServing:
        return False


def test_a_worker_writes_the_same_run_to_the_server_as_to_a_file(postgres_server, tmp_path, tiny_model_dir):
    """The scheduler hands the worker the server's URL; the run's V* rows, losses and samples are those of the same
    run on SQLite."""
    results = {}
    for name, where in (("sqlite", str(tmp_path / "file" / "studio.db")),
                        ("postgresql", postgres_server.create_database())):
        store, manager = manager_on(where, tmp_path / name)
        run_id = manager.submit(durable_spec(tiny_model_dir, max_steps=2, save_steps=1))
        manager.start()
        try:
            run = wait_status(store, run_id, ("finished", "failed"), timeout=300)
            assert run["status"] == lifecycle.FINISHED, run["error"]
            results[name] = record(store, run_id)
        finally:
            manager.close()
            store.close()
    one, two = results["sqlite"], results["postgresql"]
    assert one["values"] == two["values"] and one["samples"] == two["samples"] and one["eval"] == two["eval"]
    assert one["losses"].keys() == two["losses"].keys()
    for step, loss in one["losses"].items():
        assert two["losses"][step] == pytest.approx(loss, abs=1e-6), step
