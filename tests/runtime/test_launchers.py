"""The launchers (`app.runtime.launchers`), one backend each, with fake processes, a fake cluster and a fake clock on
a real SQLite store; and the scheduler driving a fake launcher exactly as it drives the real ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from app.access.policy import Limits, Policy
from app.runtime import journal
from app.runtime.data_folder import DataFolder
from app.runtime.devices import Devices
from app.runtime.launchers import EXITED, FAILED, LOST, Backend, Ending, Launcher, LaunchFailed
from app.runtime.launchers.forked import ForkedChunks
from app.runtime.launchers.local import LocalWorkers
from app.runtime.launchers.pages import PageChunks
from app.runtime.launchers.ray import RayWorkers
from app.runtime.processes import with_project_path
from app.runtime.ray_backend import RayUnavailable
from app.runtime.scheduler import Scheduler
from storage import Store, lifecycle
from tests import helpers

SPEC = {"name": "fake", "config": {"max_steps": 1}}


class FakeClock:
    """`monotonic`, `now` and `sleep` of a launcher: sleeping moves the clock, never the test."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def monotonic(self) -> float:
        return self.t

    now = monotonic

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def with_clock(launcher: Launcher, clock: FakeClock) -> Launcher:
    launcher.monotonic, launcher.now, launcher.sleep = clock.monotonic, clock.now, clock.sleep
    return launcher


@pytest.fixture
def store(tmp_path) -> Store:
    store = Store(tmp_path / "studio.db")
    yield store
    store.close()


def fake_worker(code: str):
    """A worker command that runs `code` and that /proc takes for the run's worker (its command line says so)."""
    return lambda run_id, spec: [sys.executable, "-c", code, "app.runtime.worker", "--run-id", str(run_id)]


# ------------------------------------------------------------------------------------------ local workers


def test_a_local_worker_that_exits_before_claiming_its_run_ends_with_its_code_and_output(store, tmp_path):
    launcher = LocalWorkers(store, DataFolder(tmp_path), fake_worker("print('loading the model'); raise SystemExit(3)"))
    run_id = store.create_run("exits", "train", SPEC)
    assert launcher.start(store.get_run(run_id), ["cpu"], with_project_path(os.environ))
    helpers.wait_for(lambda: launcher.ending(store.get_run(run_id)) is not None, 60, "the worker to exit")
    ending = launcher.ending(store.get_run(run_id))
    assert (ending.kind, ending.how) == (EXITED, "exited with code 3")
    assert "loading the model" in ending.message and "loading the model" in launcher.output(store.get_run(run_id))
    assert not launcher.alive(store.get_run(run_id)) and store.get_run(run_id)["devices"] == "cpu"


POLITE = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
          "print('set' + 'up', flush=True); time.sleep(120)")
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('set' + 'up', flush=True); "
            "time.sleep(120)")


@pytest.mark.parametrize("code, end", [(POLITE, "ask_to_stop"), (STUBBORN, "kill")])
def test_a_local_worker_stops_on_request_and_a_kill_leaves_no_process(store, tmp_path, code, end):
    launcher = LocalWorkers(store, DataFolder(tmp_path), fake_worker(code))
    run_id = store.create_run(end, "train", SPEC)
    launcher.start(store.get_run(run_id), ["cpu"], with_project_path(os.environ))
    helpers.wait_for(lambda: "setup" in launcher.output(store.get_run(run_id)), 60, "the worker to start")
    assert store.apply(run_id, lifecycle.CLAIM, pid=launcher.procs[run_id].pid)  # the worker claims its run
    run = store.get_run(run_id)
    assert launcher.alive(run) and launcher.ending(run) is None
    launcher.ask_to_stop(run)
    if end == "ask_to_stop":
        helpers.wait_for(lambda: not launcher.alive(store.get_run(run_id)), 60, "the worker to stop")
        assert launcher.ending(store.get_run(run_id)).how == "exited with code 0"
    else:  # the stop is ignored: a kill ends it, and returns once it is gone
        launcher.kill(run, timeout=60)
        assert not launcher.alive(store.get_run(run_id))
        assert launcher.ending(store.get_run(run_id)).how == f"exited with code {-signal.SIGKILL}"


def test_a_local_worker_killed_by_sigkill_is_named_so_with_the_out_of_memory_killer_as_its_usual_cause(store, tmp_path):
    # What the kernel's out-of-memory killer does to a worker: SIGKILL, with no chance to record an end.
    launcher = LocalWorkers(store, DataFolder(tmp_path), fake_worker(
        "import os, signal; print('step 4', flush=True); os.kill(os.getpid(), signal.SIGKILL)"))
    run_id = store.create_run("oom", "train", SPEC)
    assert launcher.start(store.get_run(run_id), ["cpu"], with_project_path(os.environ))
    helpers.wait_for(lambda: launcher.ending(store.get_run(run_id)) is not None, 60, "the worker to die")
    ending = launcher.ending(store.get_run(run_id))
    assert ending.how == f"exited with code {-signal.SIGKILL}"
    assert ending.message.startswith(f"Worker was killed by signal 9 (SIGKILL; exit code {-signal.SIGKILL}), which on "
                                     "Linux is most often the kernel's out-of-memory killer: `dmesg` names")
    assert "step 4" in ending.message


def test_an_adopted_worker_is_alive_only_while_its_process_is_the_runs_worker(store, tmp_path):
    launcher = LocalWorkers(store, DataFolder(tmp_path), command=None)
    run_id = store.create_run("adopted", "train", SPEC)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # alive, but not a worker
    try:
        store.apply(run_id, lifecycle.CLAIM, pid=other.pid)
        run = store.get_run(run_id)
        assert not launcher.alive(run)  # a pid reused by another program is not the run's worker
        ending = launcher.ending(run)
        assert ending.kind == FAILED and ending.message.startswith(f"Worker died: process {other.pid} is gone")
        assert launcher.followed_elsewhere(run) is None
        store.update_run(run_id, ray_job_id="a2po-run-1-abc")
        assert "--ray-address" in launcher.followed_elsewhere(store.get_run(run_id))  # a Ray job: not ours to watch
    finally:
        other.kill()
        other.wait()


def test_a_worker_of_another_studio_with_the_same_run_id_is_never_signalled(store, tmp_path):
    """A copy of the database opened by a second studio (a backup, a screenshot of a live search) names the first
    studio's worker by pid: that worker is not the second studio's to watch, kill or count as lingering."""
    here, elsewhere = DataFolder(tmp_path / "copy"), DataFolder(tmp_path / "original")
    launcher = LocalWorkers(store, here, command=None)
    run_id = store.create_run("copied", "train", SPEC)
    command = fake_worker("import time; time.sleep(120)")(run_id, SPEC)
    theirs = subprocess.Popen(command, cwd=elsewhere.make_worker_cwd())
    ours = subprocess.Popen(command, cwd=here.make_worker_cwd())
    try:
        store.apply(run_id, lifecycle.CLAIM, pid=theirs.pid)
        run = store.get_run(run_id)
        assert launcher.pid(run) is None and not launcher.alive(run)
        launcher.kill(run, timeout=5)
        assert theirs.poll() is None  # still running: the kill was not sent
        store.update_run(run_id, pid=ours.pid)  # the same command in this studio's folder is its worker
        assert launcher.pid(store.get_run(run_id)) == ours.pid and launcher.lingering(store.get_run(run_id))
        ours.kill()
        ours.wait()
        assert not launcher.lingering(store.get_run(run_id))  # the other studio's worker does not count
    finally:
        for proc in (theirs, ours):
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------ Ray jobs


class FakeCluster:
    """A Ray cluster's answers (`app.runtime.ray_backend.RayCluster`), set by the test."""

    address = "http://head:8265"

    def __init__(self) -> None:
        self.states: dict[str, str] = {}  # job id -> "RUNNING", "SUCCEEDED", "FAILED", "STOPPED" or "LOST"
        self.stops: list[str] = []
        self.refuse = False

    def devices(self) -> Devices:
        return Devices(cpu_processes=4)

    def submit(self, run_id: int, command: list[str], env: dict[str, str], cwd: str, gpus: int) -> str:
        if self.refuse:
            raise RayUnavailable("Ray did not accept the job (no node)")
        job = f"a2po-run-{run_id}-fake"
        self.states[job] = "RUNNING"
        return job

    def active(self, job: str) -> bool:
        return self.states.get(job) in ("PENDING", "RUNNING")

    def ending(self, job: str) -> str:
        return self.states[job]

    def lost(self, job: str) -> bool:
        return self.states[job] in ("STOPPED", "LOST")

    def stop(self, job: str) -> None:
        self.stops.append(job)  # this cluster never stops it: a kill waits out its timeout

    def logs(self, job: str, lines: int = 20) -> str:
        return f"the output of {job}"


def test_a_ray_job_lost_by_the_cluster_interrupts_its_run_and_a_crash_fails_it(store, tmp_path):
    cluster, clock = FakeCluster(), FakeClock()
    folder = DataFolder(tmp_path / "data")  # not made yet: the first start makes it, and writes its mark
    launcher = with_clock(RayWorkers(store, folder, fake_worker("pass"), cluster,
                                     LocalWorkers(store, folder, None)), clock)
    for state, kind in (("LOST", LOST), ("FAILED", FAILED)):
        run_id = store.create_run(state, "train", SPEC)
        assert launcher.start(store.get_run(run_id), ["ray0"], {})
        job = store.get_run(run_id)["ray_job_id"]
        assert job == f"a2po-run-{run_id}-fake" and launcher.alive(store.get_run(run_id))
        assert (tmp_path / "data" / ".a2po-data-folder").read_text().strip() == folder.token()
        assert launcher.ending(store.get_run(run_id)) is None
        cluster.states[job] = state
        ending = launcher.ending(store.get_run(run_id))
        assert ending.kind == kind and job in ending.message
        assert (f"the output of {job}" in ending.message) == (kind == FAILED)  # a crash shows the job's log
    # Ray has no kill: a stop, then a wait, on the launcher's clock.
    run_id = store.create_run("kill", "train", SPEC)
    launcher.start(store.get_run(run_id), ["ray0"], {})
    before = clock.t
    launcher.kill(store.get_run(run_id), timeout=10)
    assert cluster.stops[-1] == store.get_run(run_id)["ray_job_id"] and clock.t - before >= 10
    cluster.refuse = True
    with pytest.raises(LaunchFailed, match="could not be submitted to the Ray cluster"):
        launcher.start(store.get_run(store.create_run("refused", "train", SPEC)), ["ray0"], {})


# ------------------------------------------------------------------------------------------ chunks


class FakeProcess:
    """A forked chunk as the launcher holds it: a pid and an exit code."""

    def __init__(self, pid: int, code: int | None) -> None:
        self.pid, self.returncode = pid, code

    def poll(self) -> int | None:
        return self.returncode


def test_a_forked_chunk_that_died_without_an_end_leaves_its_run_for_the_next_chunk(store, tmp_path):
    launcher = ForkedChunks(store, DataFolder(tmp_path), budget=5)
    run_id = store.create_run("chunked", "train", {**SPEC, "runner": "chunked"})
    store.apply(run_id, lifecycle.CLAIM, pid=4242)
    launcher.procs[run_id] = FakeProcess(4242, None)
    assert launcher.alive(store.get_run(run_id)) and launcher.ending(store.get_run(run_id)) is None
    launcher.procs[run_id].returncode = -9
    ending = launcher.ending(store.get_run(run_id))
    assert (ending.kind, ending.how) == (EXITED, "exited with code -9") and launcher.settles_runs
    assert ending.message.startswith("Its chunk process was killed by signal 9 (SIGKILL; exit code -9), which on Linux")
    assert launcher.settle(store.get_run(run_id), ending.how) == "lost"
    run = store.get_run(run_id)
    assert run["status"] == lifecycle.QUEUED and run["auto_resumes"] == 1
    assert any(m["message"].startswith("Its chunk process exited with code -9") for m in store.get_logs(run_id))


def test_page_chunks_are_never_started_here_and_idle_ones_pause(store, tmp_path):
    clock = FakeClock(start=0.0)
    launcher = with_clock(PageChunks(store, DataFolder(tmp_path), budget=5, pause_after=20), clock)
    run_id = store.create_run("page", "train", {**SPEC, "runner": "chunked"})
    run = store.get_run(run_id)
    assert not launcher.starts_runs and not launcher.start(run, ["cpu"], {})
    clock.t = run["queued_at"] + 10
    launcher.each_pass()
    assert store.get_run(run_id)["status"] == lifecycle.QUEUED
    clock.t = run["queued_at"] + 30
    launcher.each_pass()
    assert store.get_run(run_id)["status"] == lifecycle.PAUSED
    # Driven by a page of this process: followed there, and a kill only asks it to stop.
    store.apply(run_id, lifecycle.UNPAUSE)
    store.apply(run_id, lifecycle.CLAIM, pid=os.getpid(), devices="zerogpu")
    run = store.get_run(run_id)
    assert launcher.alive(run) and launcher.followed_elsewhere(run) == "its page"
    launcher.kill(run)
    assert journal.stop_path(tmp_path, run_id).exists()


# ------------------------------------------------------------------------------------- the scheduler


class FakeLauncher(Launcher):
    """A backend whose process claims its run at once and ends as the test says."""

    def __init__(self, store: Store, folder: DataFolder) -> None:
        super().__init__(store, folder)
        self.ended: Ending | None = None
        self.started: list[int] = []

    def start(self, run: dict[str, Any], devices: list[str], env: dict[str, str]) -> bool:
        self.started.append(run["id"])
        self.store.apply(run["id"], lifecycle.CLAIM, pid=1)
        return True

    def alive(self, run: dict[str, Any]) -> bool:
        return self.ended is None

    def ending(self, run: dict[str, Any]) -> Ending | None:
        return self.ended

    def ask_to_stop(self, run: dict[str, Any]) -> None:
        self.ended = Ending(EXITED, "exited with code 0", "unused: the worker records its own stop")

    def kill(self, run: dict[str, Any], timeout: float = 10.0) -> None:
        self.ended = Ending(FAILED, "killed", "killed")


def test_a_data_folder_past_its_disk_quota_starts_no_queued_run_until_it_is_under(store, tmp_path):
    """The quota holds at start, not only at launch: runs queued while there was room wait once the folder is full,
    and the banner says why; they start once it is under again."""
    from types import SimpleNamespace

    from app.web.banner import QUEUE_HELD, studio_problem

    manager = Scheduler(store, tmp_path, devices=Devices())
    fake = FakeLauncher(store, manager.folder)
    manager.backend = Backend("fake", {"worker": fake})
    policy = Policy(tmp_path, Limits(disk_quota_gb=1e-6))
    manager.hold_queue = policy.disk_problem
    run_id = manager.submit(SPEC)
    (tmp_path / "checkpoint.bin").write_bytes(b"\0" * 4096)  # 4 kB: past the 1 kB quota
    manager.lock.acquire()
    try:
        assert manager.tick() == [] and fake.started == []
        assert "over its disk quota" in manager.queue_held and store.get_run(run_id)["status"] == lifecycle.QUEUED
        assert studio_problem(SimpleNamespace(scheduler=manager)) == QUEUE_HELD
        policy.limits = Limits(disk_quota_gb=1.0)  # the operator raises it (or runs are deleted)
        assert manager.tick() == [run_id] and manager.queue_held is None
        assert studio_problem(SimpleNamespace(scheduler=manager)) is None
    finally:
        manager.close()


def test_the_scheduler_treats_a_lost_process_of_any_backend_alike(store, tmp_path):
    manager = Scheduler(store, tmp_path, devices=Devices())
    fake = FakeLauncher(store, manager.folder)
    manager.backend = Backend("fake", {"worker": fake})
    run_id = manager.submit(SPEC)
    manager.lock.acquire()
    try:
        assert manager.tick() == [run_id] and fake.started == [run_id]
        assert store.get_run(run_id)["status"] == lifecycle.RUNNING
        fake.ended = Ending(LOST, "vanished", "The backend lost the worker.")
        manager.tick()  # interrupted ("lost"), then resumed at its old place, then started again
        run = store.get_run(run_id)
        logs = [m["message"] for m in store.get_logs(run_id)]
        assert "The backend lost the worker." in logs and run["auto_resumes"] == 1
        assert any(m.startswith("Resumed automatically") for m in logs)
        fake.ended = None
        manager.tick()
        assert fake.started == [run_id, run_id] and store.get_run(run_id)["status"] == lifecycle.RUNNING
        fake.ended = Ending(EXITED, "exited with code 1", "Worker exited with code 1 without recording an end.")
        manager.tick()
        assert store.get_run(run_id)["status"] == lifecycle.FAILED  # exited by itself: it would likely die again
    finally:
        manager.close()
