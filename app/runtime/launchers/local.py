"""Local worker processes: `python -m app.runtime.worker` (or `accelerate launch` of it) as a child of the studio,
in a session of its own, watched through /proc (docs/runtime.md, "Local workers")."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from app.runtime.data_folder import DataFolder
from app.runtime.launchers.base import EXITED, FAILED, Ending, Launcher, exit_text, processes_of
from app.runtime.processes import is_worker_of, launched_processes, pid_alive, works_in
from storage import Store, lifecycle


class LocalWorkers(Launcher):
    """Worker processes of this machine. `command(run_id, spec)`: the worker command."""

    def __init__(self, store: Store, folder: DataFolder, command: Any) -> None:
        super().__init__(store, folder)
        self.command = command
        self.procs: dict[int, subprocess.Popen] = {}  # run id -> the worker started here

    def is_process_of(self, pid: int, run: dict[str, Any]) -> bool:
        return is_worker_of(pid, run["id"])

    def start(self, run: dict[str, Any], devices: list[str], env: dict[str, str]) -> bool:
        run_id, spec = run["id"], run.get("config") or {}
        log_path = self.folder.run_log(run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command(run_id, spec)
        with open(log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, close_fds=True, cwd=self.folder.make_worker_cwd())
        self.procs[run_id] = proc
        self.store.update_run(run_id, devices=",".join(devices))
        processes = processes_of(spec)
        launcher = f"; accelerate launch of {processes} processes" if processes > 1 else ""
        self.store.add_log(run_id, f"Worker started (pid {proc.pid}, devices {','.join(devices)}{launcher}); its "
                                   f"output is in {log_path}.")
        return True

    def pid(self, run: dict[str, Any]) -> int | None:
        """The pid of the run's live process if this studio may signal it: the one started here, else the run's
        (never this process itself)."""
        proc = self.procs.get(run["id"])
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        pid = run.get("pid")
        if not pid or pid == os.getpid():
            return None
        return pid if pid_alive(pid) and self.owns(pid, run) else None

    def owns(self, pid: int, run: dict[str, Any]) -> bool:
        """`pid` is the run's process and works in this studio's folder: the same run id in a copy of the database
        (a backup opened elsewhere, a second studio) names another studio's worker, never this one's to kill."""
        return self.is_process_of(pid, run) and works_in(pid, self.folder.worker_cwd)

    def alive(self, run: dict[str, Any]) -> bool:
        return self.pid(run) is not None

    def ending(self, run: dict[str, Any]) -> Ending | None:
        proc = self.procs.get(run["id"])
        if proc is not None:
            code = proc.poll()
            if code is None:
                return None
            if run["status"] in lifecycle.LIVE and run["pid"] != proc.pid:
                return None  # the run names another process: this one's exit says nothing of it
            return Ending(EXITED, f"exited with code {code}",
                          f"Worker {exit_text(code)} without recording an end; last lines of its output:\n"
                          f"{self.output(run)}")
        if self.alive(run):
            return None
        return Ending(FAILED, f"(pid {run['pid']}) is gone",
                      f"Worker died: process {run['pid']} is gone (killed, for example out of memory, or crashed); "
                      f"last lines of its output:\n{self.output(run)}")

    def ask_to_stop(self, run: dict[str, Any]) -> None:
        pid = self.pid(run)
        if pid is not None:
            signal_process(pid, signal.SIGTERM)

    def kill(self, run: dict[str, Any], timeout: float = 10.0) -> None:
        """SIGKILL the process (and its process group, and a launcher's processes) and wait until they are gone."""
        pid = self.pid(run)
        if pid is None:
            return
        processes = launched_processes(pid)
        signal_process(pid, signal.SIGKILL)
        deadline = self.monotonic() + timeout
        while (pid_alive(pid) or any(map(pid_alive, processes))) and self.monotonic() < deadline:
            proc = self.procs.get(run["id"])
            if proc is not None:
                proc.poll()
            self.sleep(0.05)

    def forget(self, run_id: int) -> None:
        self.procs.pop(run_id, None)

    def lingering(self, run: dict[str, Any]) -> bool:
        """A live process of an earlier start of the run that this studio did not start, found by /proc: the run's
        by its command line (or thread name), working in this studio's folder (another studio's run of the same
        id is not this one)."""
        try:
            entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
        except OSError:
            return False
        return any(pid != os.getpid() and self.owns(pid, run) and pid_alive(pid) for pid in entries)

    def followed_elsewhere(self, run: dict[str, Any]) -> str | None:
        """A run whose worker is a Ray job: this studio cannot tell whether it lives, so it leaves the run alone (a
        studio with `--ray-address` adopts it)."""
        if run.get("ray_job_id"):
            return f"Ray job {run['ray_job_id']}: start the studio with --ray-address to watch it"
        return None


def signal_process(pid: int, sig: int) -> None:
    """Signal a worker; SIGKILL goes to its whole process group (its own session).

    A launcher of several processes (`accelerate launch`) would pass a SIGTERM on to them, then kill them after
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds and exit with an error: a stop goes to its processes directly (each asks
    for the stop; the trainer makes them agree), and a SIGKILL to their process groups as well (each process has a
    session of its own; they also die with the launcher, see `app.runtime.worker.die_with_parent`)."""
    processes = launched_processes(pid)
    targets = processes if sig == signal.SIGTERM and processes else [pid]
    if sig == signal.SIGKILL:
        targets = [pid, *processes]
    for target in targets:
        if target == os.getpid():
            continue
        try:
            if sig == signal.SIGKILL and os.getpgid(target) == target:
                os.killpg(target, sig)
            else:
                os.kill(target, sig)
        except ProcessLookupError:
            pass
