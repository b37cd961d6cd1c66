"""`JobManager`: the dashboard's job queue. Runs queued jobs one at a time, each in its own worker process.

The queue is the `runs` table, so it survives an app restart: `start()` first reconciles the table with the
processes that really exist (a "running" run whose worker died is marked failed; a live worker is re-attached),
then a scheduler thread starts the oldest queued run whenever no job is running.

Workers run in their own session (`start_new_session=True`): closing the dashboard does not kill a training
run, and the next dashboard re-attaches to it. Each worker writes its stdout/stderr to `<data_dir>/logs/`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from app.worker import HEARTBEAT_INTERVAL, run_log_path, run_output_dir
from storage import Store

# A worker whose heartbeat is older than this is considered hung (heartbeats come every HEARTBEAT_INTERVAL).
STALE_AFTER = max(60.0, 20 * HEARTBEAT_INTERVAL)
PROJECT_ROOT = Path(__file__).resolve().parents[1]
ACTIVE = ("running", "stopping")

logger = logging.getLogger("app.jobs")


def pid_alive(pid: int | None) -> bool:
    """True if process `pid` exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): trust kill(0)


def is_worker_of(pid: int, run_id: int) -> bool:
    """True unless /proc shows that `pid` is not `app.worker` for this run (a pid reused by another program)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return pid_alive(pid)
    return "app.worker" in argv and str(run_id) in argv


def describe_spec(spec: dict[str, Any]) -> tuple[str, str]:
    """Display strings (model, dataset) for the runs table."""
    dataset = spec.get("dataset") or {}
    source = dataset.get("source", "arithmetic")
    if source == "arithmetic":
        text = (f"arithmetic ({dataset.get('num_prompts', '?')} prompts, '{dataset.get('operations', '+')}', "
                f"difficulty {dataset.get('difficulty', 1)})")
    else:
        text = str(dataset.get("path") or dataset.get("name") or source)
    return str(spec.get("model", "")), text


class JobManager:
    """Submit, stop, resume and delete runs; start queued runs one at a time in worker processes.

    Args:
        store: the studio database.
        data_dir: where run outputs (`runs/run-<id>`) and worker logs (`logs/run-<id>.log`) go.
        poll_interval: seconds between two scheduler passes.
        stale_after: seconds without heartbeat after which a running run's worker counts as dead.
    """

    def __init__(self, store: Store, data_dir: str | os.PathLike[str], *, poll_interval: float = 1.0,
                 stale_after: float = STALE_AFTER) -> None:
        self.store = store
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.poll_interval = poll_interval
        self.stale_after = stale_after
        self._lock = threading.RLock()
        self._procs: dict[int, subprocess.Popen] = {}  # run id -> worker started by this manager
        self._attached: dict[int, int] = {}  # run id -> pid of a worker started by an earlier app process
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Reconcile with the processes that exist, then schedule in a background thread (idempotent)."""
        self.reconcile(schedule=True)

    def _start_scheduler(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._halt.clear()
            self._thread = threading.Thread(target=self._loop, name="a2po-scheduler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop scheduling. Running workers keep running; a later `start()` re-attaches to them."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the scheduler must outlive one bad pass (e.g. a locked disk)
                logger.exception("Scheduler pass failed; retrying in %.1f s", self.poll_interval)

    # ------------------------------------------------------------------ queue

    def submit(self, spec: dict[str, Any]) -> int:
        """Validate a run spec (see `a2po.runspec`) and queue it; returns the run id. Raises ValueError on a bad
        spec, and nothing is stored then."""
        from a2po.runspec import RunSpec

        run = RunSpec.from_dict(spec)
        clean = run.to_dict()
        model, dataset = describe_spec(clean)
        run_id = self.store.create_run(run.name, run.action, clean, model=model, dataset=dataset)
        self.store.add_log(run_id, f"Queued: {run.action} {model} on {dataset}.")
        return run_id

    def tick(self) -> int | None:
        """One scheduler pass: reap finished workers, then start the oldest queued run if none is running.
        Returns the id of the run started, if any."""
        with self._lock:
            self._reap()
            if self.active_run_ids():
                return None
            run = self.store.next_queued_run()
            if run is None:
                return None
            self._launch(run["id"])
            return run["id"]

    def active_run_ids(self) -> list[int]:
        """Runs whose worker process is alive (started here or re-attached)."""
        with self._lock:
            alive = [rid for rid, proc in self._procs.items() if proc.poll() is None]
            return alive + [rid for rid, pid in self._attached.items() if pid_alive(pid)]

    def _launch(self, run_id: int) -> None:
        log_path = run_log_path(self.data_dir, run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The worker imports `app` and `storage` from this checkout, whatever the current directory is.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "app.worker", "--db", str(self.store.path), "--run-id", str(run_id),
                   "--data-dir", str(self.data_dir)]
        with open(log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        self._procs[run_id] = proc
        self.store.add_log(run_id, f"Worker started (pid {proc.pid}); its output is in {log_path}.")

    def _reap(self) -> None:
        """Forget workers that exited; a run its worker left "running" (a crash before the last write) fails."""
        for run_id, proc in list(self._procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del self._procs[run_id]
            self._fail_if_owned(run_id, proc.pid, f"Worker exited with code {code} without recording an end; "
                                                  f"see {run_log_path(self.data_dir, run_id)}.")
        for run_id, pid in list(self._attached.items()):
            if not pid_alive(pid):
                del self._attached[run_id]
                self._fail_if_owned(run_id, pid, "Worker died (process gone).")

    def _fail_if_owned(self, run_id: int, pid: int, message: str) -> None:
        run = self.store.get_run(run_id)
        if run is not None and run["status"] in ACTIVE and run["pid"] == pid:
            self.store.transition(run_id, ACTIVE, status="failed", error=message, finished_at=time.time())
            self.store.add_log(run_id, message, level="ERROR")

    def reconcile(self, schedule: bool = True) -> list[int]:
        """Check every running run against its process: dead or hung workers -> failed ("worker died"), live ones
        re-attached; then (with `schedule`) start the scheduler thread, which starts the next queued run.
        Call at app start. Returns the ids of the runs marked failed."""
        failed = []
        now = time.time()
        with self._lock:
            self._reap()
            for run in self.store.list_runs(status=ACTIVE):
                run_id, pid = run["id"], run["pid"]
                if run_id in self._procs:
                    continue
                alive = pid_alive(pid) and is_worker_of(pid, run_id)
                last_beat = run["heartbeat_at"] or run["started_at"] or 0
                if alive and now - last_beat <= self.stale_after:
                    self._attached[run_id] = pid
                    continue
                if alive:  # hung: make sure it cannot write after being declared dead
                    self._kill(pid, signal.SIGKILL)
                    reason = f"Worker died: no heartbeat for {now - last_beat:.0f} s (pid {pid} killed)."
                else:
                    reason = f"Worker died: process {pid} is gone (killed, crashed, or the machine restarted)."
                if self.store.transition(run_id, ACTIVE, status="failed", error=reason, finished_at=now):
                    self.store.add_log(run_id, reason, level="ERROR")
                    failed.append(run_id)
        if schedule:
            self._start_scheduler()
        return failed

    # ------------------------------------------------------------------ user actions

    def stop(self, run_id: int) -> bool:
        """Ask a run to stop: a queued run is stopped at once; a running one stops after its current step (stage 2)
        or batch (stage 1), saving a checkpoint. Returns False if the run was not queued or running."""
        with self._lock:
            if self.store.transition(run_id, "queued", status="stopped", finished_at=time.time()):
                self.store.add_log(run_id, "Stopped before it started.")
                return True
            run = self.store.get_run(run_id)
            if run is None or run["status"] not in ACTIVE:
                return False
            self.store.transition(run_id, "running", status="stopping")
            self.store.add_log(run_id, "Stop requested.")
            pid = self._pid_of(run_id, run)
            if pid:
                self._kill(pid, signal.SIGTERM)
            return True

    def resume(self, run_id: int) -> int:
        """Queue a stopped or failed run again; it continues from its latest checkpoint and stored V* values.
        Returns the run id. Raises ValueError when the run cannot be resumed."""
        run = self.store.get_run(run_id)
        if run is None:
            raise ValueError(f"Run {run_id} does not exist (it may have been deleted).")
        if not self.store.requeue_run(run_id, ("stopped", "failed")):
            raise ValueError(f"Run {run_id} is {run['status']}: only stopped or failed runs can be resumed; "
                             "submit a new run to train again.")
        self.store.add_log(run_id, "Queued again to resume.")
        return run_id

    def delete(self, run_id: int, kill_timeout: float = 10.0) -> bool:
        """Delete a run: kill its worker if it runs, remove its rows, log and output directory (the shared value
        set stays). Returns False if the run did not exist."""
        with self._lock:
            run = self.store.get_run(run_id)
            if run is None:
                return False
            pid = self._pid_of(run_id, run)
            if pid and pid_alive(pid):
                self._kill(pid, signal.SIGKILL)  # no checkpoint needed, and no write after the rows are gone
                deadline = time.monotonic() + kill_timeout
                while pid_alive(pid) and time.monotonic() < deadline:
                    proc = self._procs.get(run_id)
                    if proc is not None:
                        proc.poll()
                    time.sleep(0.05)
            self._procs.pop(run_id, None)
            self._attached.pop(run_id, None)
            self.store.delete_run(run_id)
        runs_dir = self.data_dir / "runs"
        for path in {run_output_dir(self.data_dir, run_id), *([Path(run["output_dir"])] if run["output_dir"] else [])}:
            # Only directories under <data_dir>/runs: never a folder a spec or a user pointed elsewhere.
            if path.is_dir() and path.resolve() != runs_dir and path.resolve().is_relative_to(runs_dir):
                shutil.rmtree(path, ignore_errors=True)
        run_log_path(self.data_dir, run_id).unlink(missing_ok=True)
        return True

    # ------------------------------------------------------------------ helpers

    def _pid_of(self, run_id: int, run: dict[str, Any]) -> int | None:
        proc = self._procs.get(run_id)
        if proc is not None and proc.poll() is None:
            return proc.pid
        pid = self._attached.get(run_id) or run.get("pid")
        return pid if pid and pid_alive(pid) and is_worker_of(pid, run_id) else None

    @staticmethod
    def _kill(pid: int, sig: int) -> None:
        """Signal the worker; SIGKILL goes to its whole process group (its own session, see `_launch`)."""
        try:
            if sig == signal.SIGKILL and os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass
