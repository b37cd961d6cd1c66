"""The run state machine's promises, each on the real scheduler with real worker and chunk processes: restarts are
counted in a row, a stop followed by a quick Resume is no launch failure, a Resume restarts the time limit's
clock, a finished run keeps its checkpoints until its end is written, a process that never claims its run is
ended, a stop reaches a chunk in both chunked modes, and ZeroGPU's processes are never signalled."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
import time

import pytest

from app.runtime.devices import Devices
from app.runtime.scheduler import Scheduler
from storage import Store, lifecycle
from tests import helpers
from tests.runtime.test_chunks import FAKE_SPACES, chunk_spec
from tests.runtime.test_durability import MAX_STEPS, durable_spec, failed_launch, make_manager, wait_status

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
wait_for = functools.partial(helpers.wait_for, poll=0.05)


def logs(store: Store, run_id: int) -> list[str]:
    return [r["message"] for r in store.get_logs(run_id)]


def steps(store: Store, run_id: int) -> int:
    return max((m["step"] for m in store.get_metrics(run_id, names=["loss"])), default=0)


def test_auto_resume_counts_restarts_in_a_row_not_in_a_life(tmp_path):
    """A run that makes progress between interruptions is resumed at every start (README: at most 3 times *in a
    row*); one that makes none is left for a user after the third."""
    store = Store(tmp_path / "studio.db")
    trains, stuck = store.create_run("trains", "train", {}), store.create_run("stuck", "train", {})
    for restart in range(1, 6):
        for run_id in (trains, stuck):
            if store.get_run(run_id)["status"] == lifecycle.QUEUED:
                store.apply(run_id, lifecycle.CLAIM, pid=2**22 + restart)  # a worker that dies with the machine
        store.record_progress(trains, stage="train", progress=restart / 10)  # a step between two restarts
        manager = Scheduler(store, tmp_path, devices=Devices())
        try:
            manager.reconcile(schedule=False)
        finally:
            manager.close()
        assert store.get_run(trains)["status"] == lifecycle.QUEUED, restart  # resumed every time
        expected = lifecycle.QUEUED if restart <= lifecycle.MAX_AUTO_RESUMES else lifecycle.INTERRUPTED
        assert store.get_run(stuck)["status"] == expected, restart
    assert any("4 times in a row without progress" in m for m in logs(store, stuck))
    assert store.get_run(trains)["auto_resumes"] == 1


def test_stop_then_a_quick_resume_is_not_a_launch_failure(tmp_path, tiny_model_dir):
    """The stopped worker is still exiting (a slow exit: `worker_exit` delayed) when the user presses Resume."""
    store, manager = make_manager(tmp_path / "data", "worker_exit@1=delay")
    run_id = manager.submit(durable_spec(tiny_model_dir))
    manager.start()
    try:
        wait_for(lambda: steps(store, run_id) >= 2, 120, "two steps")
        manager.stop(run_id)
        wait_status(store, run_id, ("stopped",), timeout=60)
        old = store.get_run(run_id)
        manager.resume(run_id)
        assert manager.active_run_ids() == [run_id]  # the old worker still exits: no second one beside it
        run = wait_status(store, run_id, ("finished", "failed"), timeout=180)
        assert run["status"] == "finished", run["error"]
        assert run["launch_failures"] == 0
        assert not [m for m in logs(store, run_id) if "before starting the run" in m]
        assert run["started_at"] > old["finished_at"]
    finally:
        manager.close()


def test_resume_restarts_the_time_limit_of_a_chunked_run(tmp_path, tiny_model_dir):
    """Past `run_minutes` a run checkpoints and stops; Resume gives it the whole limit again (not one step)."""
    store, manager = make_manager(tmp_path / "data", chunk_seconds=0.3, run_minutes=5 / 60)
    run_id = manager.submit(chunk_spec(tiny_model_dir, max_steps=400, save_steps=0))
    manager.start()
    try:
        run = wait_status(store, run_id, ("stopped", "failed", "finished"), timeout=180)
        assert run["status"] == "stopped" and run["stop_reason"] == "limit", run["error"]
        chunks_before, steps_before = run["chunks_done"], steps(store, run_id)
        manager.resume(run_id)
        run = wait_status(store, run_id, ("stopped", "failed", "finished"), timeout=180)
        assert run["status"] == "stopped" and run["stop_reason"] == "limit"
        # The whole limit again: as many chunks as before the stop, roughly (the old clock allowed one step).
        assert run["chunks_done"] - chunks_before >= max(2, chunks_before // 2)
        assert steps(store, run_id) - steps_before >= 2
    finally:
        manager.close()


def test_a_kill_between_the_final_model_and_the_end_still_resumes_from_a_checkpoint(tmp_path, tiny_model_dir):
    store, manager = make_manager(tmp_path / "data", "record_end@1=kill")
    run_id = manager.submit(durable_spec(tiny_model_dir))
    manager.start()
    try:
        run = wait_status(store, run_id, ("failed", "finished"), timeout=180)
        assert run["status"] == "failed" and "code -9" in run["error"]
        assert store.list_checkpoints(run_id)  # its end was never written: the checkpoints are still there
        manager.worker_env = dict(os.environ, A2PO_FAULTS="")
        manager.resume(run_id)
        run = wait_status(store, run_id, ("failed", "finished"), timeout=180)
        assert run["status"] == "finished", run["error"]
        assert any(m.startswith("Run") and "resuming stage 2 from" in m and m.endswith(f"checkpoint-{MAX_STEPS}.")
                   for m in logs(store, run_id))
        wait_for(lambda: store.list_checkpoints(run_id) == [], 30, "the checkpoints to go once the end is recorded")
    finally:
        manager.close()


def test_a_worker_that_never_claims_its_run_is_killed_and_the_run_fails(tmp_path, tiny_model_dir):
    store, manager, run = failed_launch(tmp_path, tiny_model_dir, "worker_start@1=hang", launch_backoff=(0.2,),
                                        claim_timeout=3)
    try:
        assert "did not claim the run within 3 s of its start (killed), 2 times in a row" in run["error"]
        assert run["launch_failures"] == 2
        assert not manager.active_run_ids()
    finally:
        manager.close()


def test_stop_reaches_a_forked_chunk_at_its_next_step(tmp_path, tiny_model_dir):
    store, manager = make_manager(tmp_path / "data", chunk_seconds=600)  # one chunk would do the whole run
    run_id = manager.submit(chunk_spec(tiny_model_dir, max_steps=400, save_steps=0))
    manager.start()
    try:
        wait_for(lambda: steps(store, run_id) >= 2, 120, "two steps")
        assert manager.stop(run_id)
        run = wait_status(store, run_id, ("stopped", "failed", "finished"), timeout=60)
        assert run["status"] == "stopped" and run["chunks_done"] == 1, run["error"]
        assert 2 <= steps(store, run_id) < 400 and store.list_checkpoints(run_id)  # checkpointed at the stop
    finally:
        manager.close()


@pytest.fixture
def zerogpu(monkeypatch):
    """`app.runtime.zerogpu` imported with the fake `spaces` package: each GPU call in a freshly forked process."""
    monkeypatch.syspath_prepend(str(FAKE_SPACES))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    monkeypatch.delitem(sys.modules, "app.runtime.zerogpu", raising=False)
    module = importlib.import_module("app.runtime.zerogpu")
    yield module
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    monkeypatch.delitem(sys.modules, "app.runtime.zerogpu", raising=False)


def drive_in_background(driver, run_id: int) -> threading.Thread:
    thread = threading.Thread(target=driver.drive, args=(run_id,), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("action", ["stop", "delete", "watchdog"])
def test_zerogpu_chunks_are_asked_to_stop_never_signalled(tmp_path, tiny_model_dir, zerogpu, action):
    from app.access.gate import Services

    store, manager = make_manager(tmp_path / "data", zerogpu=True, chunk_seconds=600,
                                  watchdog_after=1.0 if action == "watchdog" else None)
    services = Services(store=store, scheduler=manager, data_dir=tmp_path / "data")
    driver = zerogpu.ChunkDriver(services)
    run_id = manager.submit(chunk_spec(tiny_model_dir, max_steps=400, save_steps=0))
    manager.lock.acquire()
    thread = drive_in_background(driver, run_id)
    try:
        wait_for(lambda: steps(store, run_id) >= 2, 120, "two steps of the ZeroGPU chunk")
        if action == "stop":
            assert manager.stop(run_id)
        elif action == "delete":
            assert manager.delete(run_id)
        else:
            time.sleep(2.0)
            manager.tick()  # the watchdog's pass: the GPU call's own duration bounds it, nothing is killed
        thread.join(timeout=120 if action != "watchdog" else 0.5)
        if action == "watchdog":
            assert thread.is_alive() and store.get_run(run_id)["status"] == lifecycle.RUNNING
            manager.stop(run_id)
            thread.join(timeout=120)
        assert not thread.is_alive()
        assert run_id not in driver._failed  # the GPU call returned: its process was not killed
        run = store.get_run(run_id)
        if action == "delete":
            assert run is None and not (tmp_path / "data" / "runs" / f"run-{run_id}").exists()
        else:
            assert run["status"] == lifecycle.STOPPED and store.list_checkpoints(run_id)
    finally:
        manager.stop(run_id)
        thread.join(timeout=60)
        manager.close()


@pytest.mark.parametrize("schedule", [
    {"max_steps": 8, "eval_steps": 2},
    # Epochs (no max_steps) and an eval_steps fraction, as "A*-PO vs GRPO" sets it: 12 prompts, 4 a step, 3 epochs
    # = 9 steps, an evaluation every ceil(9 x 0.25) = 3.
    {"max_steps": -1, "num_train_epochs": 3.0, "eval_steps": 0.25},
], ids=["steps", "fraction-of-epochs"])
def test_a_long_evaluation_is_left_for_the_next_chunk_not_cut_off(tmp_path, tiny_model_dir, zerogpu, monkeypatch,
                                                                  schedule):
    """ZeroGPU ends a call that runs past its duration (budget + margin; the fake `spaces` does too). An evaluation
    that starts near a chunk's deadline would run past it every time and fail the run: it is left for the next chunk,
    which starts with it."""
    from app.access.gate import Services

    monkeypatch.setattr(zerogpu, "CHUNK_MARGIN", 4.0)
    monkeypatch.setenv("A2PO_FAULTS", "evaluate_batch@1+=delay")  # each evaluation batch takes 2 s more: 4 s each
    store, manager = make_manager(tmp_path / "data", zerogpu=True, chunk_seconds=4.0, watchdog_after=None)
    services = Services(store=store, scheduler=manager, data_dir=tmp_path / "data")
    driver = zerogpu.ChunkDriver(services)
    spec = chunk_spec(tiny_model_dir, save_steps=0, per_device_eval_batch_size=1, **schedule)
    spec["dataset"]["eval_size"] = 2
    run_id = manager.submit(spec)
    manager.lock.acquire()
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            info = driver.drive(run_id)
            if info["status"] not in ("queued", "paused", "running"):
                break
        run = store.get_run(run_id)
        messages = logs(store, run_id)
        assert run["status"] == "finished", (run["error"], messages[-10:])
        assert not [m for m in messages if "GPU call for the chunk failed" in m]
        assert any("is left for the next chunk" in m for m in messages)
        expected = [0, 2, 4, 6, 8] if schedule["max_steps"] > 0 else [0, 3, 6, 9]
        assert [e["step"] for e in store.get_evaluations(run_id)] == expected
    finally:
        manager.close()
