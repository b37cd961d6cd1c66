"""Durable runs: a worker killed at chosen points (stage 1 mid-batch, stage 2 mid-step, mid-checkpoint, during a
database write) and resumed ends exactly where an uninterrupted run with the same seed ends: the same V* table,
no lost or duplicated rows, the same number of steps, the same losses (fp32 on the CPU, within 1e-6).

Real worker processes, a real SQLite file per scenario, the tiny random-init model, faults armed through
`A2PO_FAULTS` (`a2po._faults`). The scheduler's own failure modes (watchdog, single instance, stuck runs, launch
loops, id reuse, the container-stop path) are here too.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from app.runtime.devices import Devices
from app.runtime.processes import pid_alive
from app.runtime.scheduler import AlreadyServing, Scheduler
from storage import Store, lifecycle
from tests import helpers
from tests.web.test_app_api import free_port, start_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
wait_for = functools.partial(helpers.wait_for, poll=0.05)
MAX_STEPS = 8


def durable_spec(model: str, name: str = "durable", **config) -> dict:
    """16 prompts in 4 stage-1 batches, 8 steps of 4 prompts, a checkpoint every 2 steps, 4 held-out prompts."""
    settings = {"num_value_samples": 2, "max_completion_length": 8, "max_steps": MAX_STEPS,
                "per_device_train_batch_size": 4, "value_batch_size": 4, "use_cpu": True, "logging_steps": 1,
                "gradient_checkpointing": False, "seed": 0, "save_steps": 2, "learning_rate": 1e-3,
                "filter_all_incorrect": False, **config}  # a random-init model solves nothing: keep every prompt
    return {"name": name, "action": "train", "model": model,
            "dataset": {"source": "arithmetic", "num_prompts": 16, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 4},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings}


def make_manager(data_dir: Path, faults: str = "", **options) -> tuple[Store, Scheduler]:
    store = Store(data_dir / "studio.db")
    env = dict(os.environ, A2PO_FAULTS=faults)
    options = {"poll_interval": 0.1, "devices": Devices(), **options}
    return store, Scheduler(store, data_dir, worker_env=env, **options)


def wait_status(store: Store, run_id: int, statuses: tuple[str, ...], timeout: float = 120.0) -> dict:
    return helpers.wait_status(store, run_id, statuses, timeout, poll=0.05)


def record(store: Store, run_id: int) -> dict:
    """What a run produced: its V* rows, losses by step and row counts (for equality between runs)."""
    run = store.get_run(run_id)
    values = {(v["split"], v["prompt_id"]): (v["v_star"], v["rewards"], v["completions"], v["filtered"])
              for v in store.get_values(run["value_set_id"], split=None)}
    losses = [(m["step"], m["value"]) for m in store.get_metrics(run_id, names=["loss"])]
    return {"values": values, "losses": dict(losses), "loss_rows": len(losses),
            "samples": Counter((s["split"], s["step"]) for s in store.get_samples(run_id, limit=None)),
            "eval": [e["metrics"]["eval_accuracy"] for e in store.get_evaluations(run_id)],
            "steps": max((step for step, _ in losses), default=0)}


def assert_same_run(resumed: dict, reference: dict) -> None:
    assert resumed["values"] == reference["values"]  # V* identical: every prompt, reward and completion
    assert resumed["steps"] == reference["steps"] == MAX_STEPS
    assert resumed["loss_rows"] == MAX_STEPS and resumed["samples"] == reference["samples"]  # none lost or doubled
    for step, loss in reference["losses"].items():
        assert resumed["losses"][step] == pytest.approx(loss, abs=1e-6), f"step {step}"
    assert resumed["eval"] == reference["eval"]


def resume(store: Store, manager: Scheduler, run_id: int, faults: str = "") -> dict:
    """Resume the run with `faults` armed in its new worker; wait until it ends."""
    manager.worker_env = dict(os.environ, A2PO_FAULTS=faults)
    manager.resume(run_id)
    return wait_status(store, run_id, ("finished", "failed"), timeout=180)


def killed(run: dict) -> None:
    assert run["status"] == "failed" and "code -9" in run["error"], run["error"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir) -> dict:
    """An uninterrupted run, and a second run of the same spec in the same data folder (which reuses the stored V*
    set instead of sampling it): stage 2 must not depend on whether stage 1 sampled."""
    store, manager = make_manager(tmp_path_factory.mktemp("reference"))
    first = manager.submit(durable_spec(tiny_model_dir, "first"))
    second = manager.submit(durable_spec(tiny_model_dir, "second"))
    manager.start()
    try:
        for run_id in (first, second):
            run = wait_status(store, run_id, ("finished", "failed"), timeout=180)
            assert run["status"] == "finished", run["error"]
        logs = [r["message"] for r in store.get_logs(second)]
        assert any("Stage 1 (train): 0 of 16 prompts to sample" in m for m in logs), logs
        one, two = record(store, first), record(store, second)
        assert one["losses"] == two["losses"] and one["values"] == two["values"]
        # A finished run keeps its final model, not its checkpoints.
        assert store.list_checkpoints(first) == [] and not list(Path(store.get_run(first)["output_dir"]).glob(
            "checkpoint-*"))
        return one
    finally:
        manager.close()


def test_killed_at_each_point_and_resumed_it_ends_like_an_uninterrupted_run(tmp_path, tiny_model_dir, reference):
    store, manager = make_manager(tmp_path / "data", "values_batch@2=kill")
    run_id = manager.submit(durable_spec(tiny_model_dir))
    manager.start()
    try:
        # 1. Stage 1, mid-batch: the 2nd batch was sampled and scored, not stored; it is sampled again later.
        killed(wait_status(store, run_id, ("failed", "finished")))
        value_set_id = store.get_run(run_id)["value_set_id"]
        assert store.count_values(value_set_id, "train") == 4

        # 2. Stage 2, inside step 3 (checkpoint-2 saved): the next worker resumes from checkpoint-2.
        killed(resume(store, manager, run_id, "train_step@3=kill"))
        assert store.count_values(value_set_id, "train") == 16 and store.latest_checkpoint(run_id)["step"] == 2
        output = Path(store.get_run(run_id)["output_dir"])

        # 3. Mid-checkpoint: checkpoint-4's weights written, not its optimizer, RNG and trainer state. The resume
        # must skip that torn folder, and remove it (the Trainer's rotation would keep it over good ones).
        killed(resume(store, manager, run_id, "checkpoint@1=kill"))
        assert (output / "checkpoint-4" / "model.safetensors").is_file()
        assert not (output / "checkpoint-4" / "trainer_state.json").exists()

        # 4. During a database write: the test holds SQLite's write lock, the worker's next write waits inside
        # SQLite, and it is killed there.
        manager.worker_env = dict(os.environ, A2PO_FAULTS="")
        manager.resume(run_id)
        wait_for(lambda: store.latest_checkpoint(run_id)["step"] >= 4, 120, "checkpoint-4, written again")
        pid = store.get_run(run_id)["pid"]
        blocker = sqlite3.connect(store.path, timeout=30, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        time.sleep(1.5)
        os.killpg(pid, signal.SIGKILL)
        time.sleep(0.3)
        blocker.execute("ROLLBACK")
        blocker.close()
        killed(wait_status(store, run_id, ("failed", "finished")))

        # 5. The last resume runs to the end: the same run as one never interrupted.
        run = resume(store, manager, run_id)
        assert run["status"] == "finished", run["error"]
        assert_same_run(record(store, run_id), reference)
        logs = [r["message"] for r in store.get_logs(run_id)]
        assert any(m.endswith("removing incomplete checkpoint " + str(output / "checkpoint-4") + ".")
                   for m in logs), logs
        resumed_from = [m.rsplit("-", 1)[-1] for m in logs if m.startswith("Run ") and "resuming stage 2 from" in m]
        # From checkpoint-2 after the torn checkpoint-4 (launch 3), from 4 or 6 at the end. (Launch 4's INFO line
        # may be lost: log lines are flushed every second or two, and that worker died with its writes blocked.)
        assert resumed_from[0] == "2." and resumed_from[-1] in ("4.", "6."), resumed_from
        assert any("Stage 1 (train): 12 of 16 prompts to sample" in m for m in logs), logs
    finally:
        manager.close()


def test_a_worker_stopped_from_outside_is_interrupted_and_resumed(tmp_path, tiny_model_dir, reference):
    """A SIGTERM the studio did not send (a kill by hand, a drained node): the worker checkpoints, the run is
    interrupted (reason "lost", not "stopped" as a user's stop), and the scheduler resumes it by itself from that
    checkpoint to the same result."""
    from app.runtime.worker import OUTSIDE_STOP

    # Steps from the 2nd on take 2 s more: the SIGTERM arrives while the run trains, however fast the machine.
    store, manager = make_manager(tmp_path / "data", "train_step@2+=delay")
    run_id = manager.submit(durable_spec(tiny_model_dir, "outside"))
    manager.start()
    try:
        wait_for(lambda: len(store.get_metrics(run_id, names=["loss"])) >= 2, 120, "two training steps")
        first = store.get_run(run_id)["pid"]
        os.kill(first, signal.SIGTERM)
        wait_for(lambda: (r := store.get_run(run_id))["status"] == "running" and r["pid"] not in (None, first), 120,
                 "the run to resume in a new worker")
        messages = [r["message"] for r in store.get_logs(run_id)]
        assert OUTSIDE_STOP in messages and any(m.startswith("Resumed automatically") for m in messages), messages
        run = wait_status(store, run_id, ("finished", "failed", "stopped", "interrupted"), timeout=180)
        assert run["status"] == "finished", run
        assert_same_run(record(store, run_id), reference)
    finally:
        manager.close()


def test_a_run_that_fills_the_disk_waits_for_space_and_resumes_to_the_same_result(tmp_path, tiny_model_dir,
                                                                                   reference):
    """A checkpoint written on a full disk (ENOSPC after its weights, as safetensors or torch.save meet it): the run
    is interrupted, not failed, queued again, held while the disk is full, and once space is free it resumes from
    its last complete checkpoint (the torn one removed) to the same result as a run never interrupted."""
    from app.runtime.worker import DISK_FULL

    # Every step takes a second more, so the test holds the queue before the run reaches checkpoint-4.
    store, manager = make_manager(tmp_path / "data", "train_step@1+=delay,checkpoint@2=disk_full")
    manager.worker_env["A2PO_FAULT_DELAY"] = "1"
    full = {"disk": False}
    manager.hold_queue = lambda: "The disk is full." if full["disk"] else None  # the studio's `Policy.disk_problem`
    run_id = manager.submit(durable_spec(tiny_model_dir, "disk-full"))
    manager.start()
    try:
        wait_status(store, run_id, ("running",))
        full["disk"] = True
        manager.worker_env = dict(os.environ, A2PO_FAULTS="")  # the next worker writes on a disk with room again
        wait_for(lambda: store.get_run(run_id)["auto_resumes"] >= 1, 120, "the run interrupted and queued again")
        run = store.get_run(run_id)
        assert run["status"] == "queued" and run["error"] is None, run  # not failed; the reason is in its log
        messages = [r["message"] for r in store.get_logs(run_id)]
        reason = next(m for m in messages if m.startswith(DISK_FULL.split("(")[0]))
        assert "No space left on device" in reason and "resumes it from its latest complete checkpoint" in reason
        assert any(m.startswith("Resumed automatically") for m in messages), messages
        output = Path(run["output_dir"])
        assert (output / "checkpoint-4" / "model.safetensors").is_file()  # torn: no trainer state
        assert not (output / "checkpoint-4" / "trainer_state.json").exists()
        time.sleep(1.0)  # scheduler passes every 0.1 s: none starts it while the disk is full
        assert store.get_run(run_id)["status"] == "queued" and manager.queue_held == "The disk is full."
        full["disk"] = False
        run = wait_status(store, run_id, ("finished", "failed", "stopped", "interrupted"), timeout=180)
        assert run["status"] == "finished", run
        assert_same_run(record(store, run_id), reference)
        messages = [r["message"] for r in store.get_logs(run_id)]
        assert any(m.endswith("removing incomplete checkpoint " + str(output / "checkpoint-4") + ".")
                   for m in messages), messages
    finally:
        manager.close()


def test_a_full_disk_is_told_apart_from_other_failures():
    """What a full disk raises through the libraries the worker writes with: the kernel's ENOSPC (here from
    /dev/full, a device that is always full), safetensors' wrapping of it (its text as a checkpoint of the recipe
    search met it), SQLite's, and one raised from another."""
    from safetensors import SafetensorError

    from app.runtime.worker import disk_full

    with pytest.raises(OSError) as kernel:
        with open("/dev/full", "wb", buffering=0) as device:
            device.write(b"x")
    wrapped = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as cause:
            raise RuntimeError("saving the checkpoint failed") from cause
    except RuntimeError as chained:
        from_another = chained
    assert disk_full(kernel.value) and disk_full(wrapped) and disk_full(from_another)
    assert disk_full(sqlite3.OperationalError("database or disk is full"))
    assert not disk_full(OSError(13, "Permission denied")) and not disk_full(RuntimeError("CUDA out of memory"))


def test_a_stop_nobody_asked_for_ends_interrupted_a_requested_one_stopped():
    assert lifecycle.end_event("stopped", None) is lifecycle.INTERRUPT
    assert lifecycle.end_event("stopped", "shutdown") is lifecycle.INTERRUPT
    assert all(lifecycle.end_event("stopped", reason) is lifecycle.STOP for reason in ("user", "limit", "watchdog"))
    assert lifecycle.end_event("finished", None) is lifecycle.FINISH


def test_container_stop_checkpoints_and_the_next_start_resumes(tmp_path, tiny_model_dir, reference):
    """SIGTERM to the app (what `docker stop` sends): workers checkpoint and stop, runs become "interrupted", and
    the next start resumes them from that checkpoint to the same result."""
    data_dir = tmp_path / "studio"
    store = Store(data_dir / "studio.db")
    run_id = Scheduler(store, data_dir, devices=Devices()).submit(durable_spec(tiny_model_dir))
    # Steps from the 4th on take 6 s more: the SIGTERM arrives while the run still trains, however fast or busy the
    # CPU.
    app = start_app(data_dir, free_port(), env={"A2PO_FAULTS": "train_step@4+=delay", "A2PO_FAULT_DELAY": "6"})
    try:
        wait_for(lambda: len(store.get_metrics(run_id, names=["loss"])) >= 3, 120, "three training steps")
        app.send_signal(signal.SIGTERM)
        assert app.wait(timeout=60) == 0
    finally:
        if app.poll() is None:
            app.kill()
    run = store.get_run(run_id)
    assert run["status"] == "interrupted" and run["stop_reason"] == "shutdown", run
    checkpoint = store.latest_checkpoint(run_id)
    stopped_at = max(m["step"] for m in store.get_metrics(run_id, names=["loss"]))
    assert checkpoint is not None and checkpoint["step"] == stopped_at < MAX_STEPS  # saved on the way out
    assert not pid_alive(run["pid"])

    app = start_app(data_dir, free_port())
    try:
        run = wait_status(store, run_id, ("finished", "failed"), timeout=180)
        assert run["status"] == "finished", run["error"]
    finally:
        app.terminate()
        app.wait(timeout=60)
    logs = [r["message"] for r in store.get_logs(run_id)]
    assert any("Resumed automatically" in m for m in logs), logs
    assert any(m.endswith(f"checkpoint-{stopped_at}.") and "resuming stage 2" in m for m in logs), logs
    assert_same_run(record(store, run_id), reference)


def test_watchdog_kills_a_hung_worker_with_a_live_heartbeat(tmp_path, tiny_model_dir):
    # The main thread hangs in step 2; the heartbeat thread goes on beating.
    store, manager = make_manager(tmp_path / "data", "train_step@2=hang", watchdog_after=25.0)
    run_id = manager.submit(durable_spec(tiny_model_dir))
    manager.start()
    try:
        running = wait_for(lambda: (r := store.get_run(run_id))["status"] == "running" and r, 60, "the claim")
        failed = wait_status(store, run_id, ("failed",), timeout=120)
        assert failed["error"].startswith("Watchdog: the worker") and "no progress" in failed["error"]
        assert "Stage 1 (eval) done" in failed["error"]  # with its last log lines
        assert failed["stop_reason"] == "watchdog" and failed["heartbeat_at"] > failed["progress_at"] + 1
        assert not pid_alive(running["pid"])
    finally:
        manager.close()


def test_one_scheduler_per_data_dir(tmp_path):
    store, first = make_manager(tmp_path / "data")
    first.start(address="http://127.0.0.1:1")
    _, second = make_manager(tmp_path / "data")
    with pytest.raises(AlreadyServing, match=rf"already serving .*\"pid\": {os.getpid()}"):
        second.start()
    # A real second app says so and exits.
    app = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path / "data"), "--port",
                          str(free_port())], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1"))
    assert app.returncode == 1 and "Another A*-PO Studio is already serving" in app.stderr
    first.close()
    second.start()
    second.close()


def test_a_worker_that_dies_before_its_final_write_does_not_leave_the_run_running(tmp_path, tiny_model_dir):
    # The job finishes, then the worker dies right before writing "finished": the scheduler writes the end, and
    # the next run in the queue starts.
    store, manager = make_manager(tmp_path / "data", "record_end@1=kill")
    stuck = manager.submit(durable_spec(tiny_model_dir, max_steps=1, save_steps=1))
    after = manager.submit(durable_spec(tiny_model_dir, "after", max_steps=1, save_steps=1))
    manager.start()
    try:
        run = wait_status(store, stuck, ("failed", "finished"))
        assert run["status"] == "failed" and "without recording an end" in run["error"]
        assert wait_status(store, after, ("failed", "finished"))["status"] == "failed"  # same fault, same end
    finally:
        manager.close()

    # A failing write is retried by the worker itself.
    store, manager = make_manager(tmp_path / "data2", "record_end@1=raise")
    run_id = manager.submit(durable_spec(tiny_model_dir, max_steps=1, save_steps=1))
    manager.start()
    try:
        assert wait_status(store, run_id, ("failed", "finished"))["status"] == "finished"
        assert "Fault injected at record_end" in (tmp_path / "data2" / "logs" / f"run-{run_id}.log").read_text()
    finally:
        manager.close()


def test_runs_whose_worker_is_gone(tmp_path):
    store, manager = make_manager(tmp_path / "data")
    interrupted = store.create_run("interrupted", "train", {})
    store.apply(interrupted, lifecycle.CLAIM, pid=2**22 + 16)  # no such process: it died while no studio was running
    manager = Scheduler(store, tmp_path / "data", devices=Devices(), auto_resume=False)
    try:
        assert manager.reconcile(schedule=False) == [interrupted]  # at start: an interruption, resumable
        run = store.get_run(interrupted)
        assert run["status"] == "interrupted" and "gone when the studio started" in run["error"]
        # While the studio watches, a vanished worker fails its run (it would likely die again).
        orphan = store.create_run("orphan", "train", {})
        store.apply(orphan, lifecycle.CLAIM, pid=2**22 + 17)
        manager.tick()
        run = store.get_run(orphan)
        assert run["status"] == "failed" and "is gone" in run["error"]
        # Stop of a run whose worker is gone ends it at once: no eternal "stopping".
        other = store.create_run("other", "train", {})
        store.apply(other, lifecycle.CLAIM, pid=2**22 + 18)
        store.apply(other, lifecycle.REQUEST_STOP)
        assert manager.stop(other) and store.get_run(other)["status"] == "stopped"
        assert manager.resume(interrupted) == interrupted and store.get_run(interrupted)["status"] == "queued"
    finally:
        manager.close()


def finished_run(data_dir: Path, spec: dict, timeout: float = 240.0) -> tuple[Store, dict]:
    """`spec` run by one worker from start to end (checked finished): the store and the run."""
    store, manager = make_manager(data_dir)
    run_id = manager.submit(spec)
    manager.start()
    try:
        run = wait_status(store, run_id, ("finished", "failed"), timeout=timeout)
    finally:
        manager.close()
    assert run["status"] == "finished", run["error"]
    return store, run


def failed_launch(tmp_path: Path, model: str, fault: str, **options) -> tuple[Store, Scheduler, dict]:
    """A durable run whose worker meets `fault` at its start, and the run once it failed; close the manager."""
    store, manager = make_manager(tmp_path / "data", fault, **options)
    run_id = manager.submit(durable_spec(model))
    manager.start()
    try:
        return store, manager, wait_status(store, run_id, ("failed",), timeout=120)
    except BaseException:
        manager.close()
        raise


def test_a_worker_dying_before_its_claim_is_retried_then_failed(tmp_path, tiny_model_dir):
    store, manager, run = failed_launch(tmp_path, tiny_model_dir, "worker_start@1=kill", launch_backoff=(0.2, 0.4))
    run_id = run["id"]
    try:
        assert "exited with code -9 before starting the run, 3 times in a row" in run["error"]
        assert run["launch_failures"] == 3
        starts = [r for r in store.get_logs(run_id) if r["message"].startswith("Worker started")]
        assert len(starts) == 3
        time.sleep(1.0)
        assert len([r for r in store.get_logs(run_id) if r["message"].startswith("Worker started")]) == 3
    finally:
        manager.close()


def test_ids_are_never_reused_and_files_go_with_their_run(tmp_path):
    store, manager = make_manager(tmp_path / "data")
    first = store.create_run("first", "train", {})
    newest = store.create_run("newest", "train", {})
    exports = tmp_path / "data" / "exports"
    exports.mkdir(parents=True)
    (exports / f"run-{newest}-metrics.csv").write_text("step,loss\n")
    (exports / f"run-{first}-metrics.csv").write_text("step,loss\n")
    (tmp_path / "data" / "runs" / f"run-{newest}").mkdir(parents=True)
    assert manager.delete(newest)
    assert not (exports / f"run-{newest}-metrics.csv").exists() and (exports / f"run-{first}-metrics.csv").exists()
    assert not (tmp_path / "data" / "runs" / f"run-{newest}").exists()
    assert store.create_run("next", "train", {}) == newest + 1
    # Files left by a run deleted under an older studio go at the next start.
    (exports / "run-99-samples.csv").write_text("x\n")
    (tmp_path / "data" / "logs").mkdir()
    (tmp_path / "data" / "logs" / "run-99.log").write_text("x\n")
    manager.reconcile(schedule=False)
    manager.close()
    assert not (exports / "run-99-samples.csv").exists() and not (tmp_path / "data" / "logs" / "run-99.log").exists()
    assert (exports / f"run-{first}-metrics.csv").exists()


def test_devices_rule_counts_runs_started_elsewhere(tmp_path):
    assert Devices().allocate(1, set()) == ["cpu"] and Devices().allocate(1, {"cpu"}) is None
    gpus = Devices(("0", "1", "2"))
    assert gpus.allocate(2, {"0"}) == ["1", "2"] and gpus.allocate(2, {"0", "2"}) is None
    assert gpus.allocate(1, {"*"}) is None
    assert gpus.check(4).startswith("This machine has 3 GPU(s); the run asks for 4 processes")
    assert Devices(cpu_processes=2).check(2) is None and Devices(cpu_processes=1).check(2)  # gloo on the CPU
    assert Devices.parse("2").gpus == ("0", "1") and Devices.parse("0,3").gpus == ("0", "3")
    assert Devices.parse("none").gpus == ()

    store, manager = make_manager(tmp_path / "data")
    # A live worker of another studio process on this folder (its command line names app.runtime.worker and its run
    # id, and it works in the folder's worker directory as every worker does).
    running = store.create_run("elsewhere", "train", {})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "app.runtime.worker", "--run-id",
                                str(running)], cwd=manager.folder.make_worker_cwd())
    try:
        store.apply(running, lifecycle.CLAIM, pid=sleeper.pid)
        store.update_run(running, devices="cpu")
        queued = store.create_run("waits", "train", {})
        manager.lock.acquire()
        assert manager.tick() == [] and store.get_run(queued)["status"] == "queued"  # the CPU is taken
        assert manager.active_run_ids() == [running]
    finally:
        sleeper.kill()
        sleeper.wait()
        manager.close()
    with pytest.raises(ValueError, match="no GPU"):
        manager.submit({**durable_spec("x"), "num_processes": 4096})


def test_fault_spec_parsing():
    from a2po import _faults

    assert _faults.parse("a@2=hang, b") == {"a": (2, "hang", False), "b": (1, "kill", False)}
    assert _faults.parse("c@3+=delay") == {"c": (3, "delay", True)}
    with pytest.raises(ValueError, match="name@count=action"):
        _faults.parse("a@x=kill")
    with pytest.raises(ValueError, match="name@count=action"):
        _faults.parse("a=explode")
    assert json.dumps(_faults.parse("")) == "{}"
