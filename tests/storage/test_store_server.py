"""The studio on a PostgreSQL server (`--db postgresql+psycopg://...`, docs/cluster.md): one scheduler per database
by an advisory lock that dies with its holder, workers that write to the server, and the same run as on SQLite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from app.runtime.scheduler import AlreadyServing, Devices, Scheduler
from storage import Store, lifecycle
from tests.helpers import wait_for
from tests.runtime.test_durability import durable_spec, free_port, record, wait_status

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


def manager_on(url: str, data_dir, **options) -> tuple[Store, Scheduler]:
    store = Store(url)
    return store, Scheduler(store, data_dir, devices=Devices(), poll_interval=0.1,
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


# ------------------------------------------------------------------------------------ the server restarts
# A restart ends the connection that held the scheduler's advisory lock: the studio must notice, schedule nothing
# while it is without it (never two schedulers on one queue), and take it back.


def _stub_launches(manager: Scheduler) -> None:
    """Starting a worker does nothing: `tick()` still returns the runs it would have started."""
    manager._launch = lambda run, devices: True


def test_a_lost_lock_stops_scheduling_until_it_is_taken_back(postgres_server, tmp_path, caplog):
    """Passes driven one by one: the server down, a second studio that takes the lock while the first is without
    it (the first schedules nothing), then the first again once the second has gone."""
    url = postgres_server.create_database()
    store, first = manager_on(url, tmp_path / "one")
    _stub_launches(first)
    first.reconcile(schedule=False, address="http://first")
    run_id = store.create_run("queued", "train", {})
    assert first.tick() == [run_id] and first.lock_problem is None
    postgres_server.go_down()
    try:
        assert first.tick() == [] and "does not answer" in first.lock_problem
    finally:
        postgres_server.come_back()
    other_store, second = manager_on(url, tmp_path / "two")
    _stub_launches(second)
    second.reconcile(schedule=False, address="http://second")  # before the first's next pass
    for _ in range(2):
        assert first.tick() == [] and "http://second" in first.lock_problem
        assert second.tick() == [run_id]
    second.close()
    assert first.tick() == [run_id] and first.lock_problem is None and first.lock.held
    _, third = manager_on(url, tmp_path / "three")
    with pytest.raises(AlreadyServing, match="http://first"):
        third.start()
    said = [r.getMessage() for r in caplog.records if r.name == "app.runtime.scheduler"]
    assert any("lost its lock" in m and "does not answer" in m for m in said)
    assert any("lost its lock" in m and "http://second" in m for m in said)
    assert any("taken back" in m for m in said)
    first.close()
    store.close()
    other_store.close()


def test_a_running_studio_takes_its_lock_back_after_a_server_restart(postgres_server, tmp_path):
    """Two studios on one database: the second is refused before the restart and after it; the first's scheduler
    thread shows the lost lock (the pages' banner) while the server is down."""
    from types import SimpleNamespace

    from app.web.banner import LOCK_LOST, studio_problem

    url = postgres_server.create_database()
    store, first = manager_on(url, tmp_path / "one")
    first.start(address="http://first")
    _, second = manager_on(url, tmp_path / "two")
    with pytest.raises(AlreadyServing, match="http://first"):
        second.start()
    assert studio_problem(SimpleNamespace(scheduler=first)) is None
    postgres_server.go_down()
    try:
        wait_for(lambda: first.lock_problem, 30, "the lost lock to be noticed", poll=0.05)
        assert studio_problem(SimpleNamespace(scheduler=first)) == LOCK_LOST
    finally:
        postgres_server.come_back()
    wait_for(lambda: first.lock_problem is None, 30, "the lock to be taken back", poll=0.05)
    with pytest.raises(AlreadyServing, match="http://first"):
        second.start()
    first._launch = lambda run, devices: store.apply(run["id"], lifecycle.CANCEL)
    run_id = store.create_run("after the restart", "train", {})
    wait_for(lambda: store.get_run(run_id)["status"] != lifecycle.QUEUED, 30, "the first to schedule again")
    first.close()
    store.close()


def _asleep_in_a_fault_delay(pid: int | None) -> bool:
    """Whether the worker's main thread sleeps (a `delay` fault point): it touches the database nowhere then."""
    try:
        return pid is not None and open(f"/proc/{pid}/wchan").read() == "hrtimer_nanosleep"
    except OSError:
        return False


def _restart_while_asleep(server, store: Store, run_id: int, reached) -> None:
    """Once `reached(run)` holds and the worker sleeps in its fault delay, restart the server under it."""
    def ready() -> bool:
        run = store.get_run(run_id)
        return reached(run) and _asleep_in_a_fault_delay(run["pid"])

    wait_for(ready, 120, "the worker to wait at its fault point", poll=0.1)
    server.restart()


def test_a_server_restart_in_stage_1_and_in_stage_2_loses_nothing(postgres_server, tmp_path, tiny_model_dir):
    """The server restarted as an operator does (fast shutdown: clients cut off) under a worker in stage 1 and
    again in stage 2, while it waits at a fault point: its pooled connections reconnect, the scheduler takes its
    lock back, and the run ends with the V* table and losses of an uninterrupted run."""
    from tests.runtime.test_durability import assert_same_run

    spec = durable_spec(tiny_model_dir, max_steps=8)
    store, manager = manager_on(str(tmp_path / "file" / "studio.db"), tmp_path / "reference")
    reference_id = manager.submit(spec)
    manager.start()
    try:
        assert wait_status(store, reference_id, ("finished", "failed"), timeout=300)["status"] == "finished"
        reference = record(store, reference_id)
    finally:
        manager.close()
        store.close()
    store, manager = manager_on(postgres_server.create_database(), tmp_path / "studio")
    manager.worker_env.update(A2PO_FAULTS="values_batch@2=delay,train_step@3=delay", A2PO_FAULT_DELAY="8")
    run_id = manager.submit(spec)
    manager.start()
    try:
        # The 2nd stage-1 batch (the 1st is stored), then the 3rd step (two are stored; the progress shown may lag).
        _restart_while_asleep(postgres_server, store, run_id, lambda r: r["stage"] == "values")
        _restart_while_asleep(postgres_server, store, run_id, lambda r: r["stage"] == "train")
        run = wait_status(store, run_id, ("finished", "failed"), timeout=300)
        assert run["status"] == lifecycle.FINISHED, run["error"]
        assert_same_run(record(store, run_id), reference)
        assert manager.lock_problem is None and manager.lock.held
    finally:
        manager.close()
        store.close()
