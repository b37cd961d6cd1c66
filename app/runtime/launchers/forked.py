"""Forked chunks: each chunk of a chunked run in a freshly forked copy of the studio's process, which never touches
the database; the scheduler claims the run before the fork and applies the chunk's journal (docs/runtime.md,
"Forked chunks").

A fork copies the parent's memory, so the parent must not have started torch's OpenMP threads: a forked child then
hangs in its first parallel operation. The studio's process never runs a torch operation (models load only in
workers, chunks and the playground's own process); only the chunk does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from app.runtime import chunks, journal
from app.runtime.chunks import DEFAULT_BUDGET, is_chunk_of, named_thread, run_chunk, thread_name, worker_directory
from app.runtime.data_folder import DataFolder
from app.runtime.launchers.base import EXITED, FAILED, Ending, exit_text
from app.runtime.launchers.local import LocalWorkers, signal_process
from storage import Store, lifecycle


class ForkedChunks(LocalWorkers):
    """Chunks forked by the scheduler, one at a time per run; `budget`: seconds of work per chunk."""

    settles_runs = True
    paused = False  # what a lost chunk leaves its run: queued for the next chunk (True: paused, for a page)

    def __init__(self, store: Store, folder: DataFolder, budget: float | None = None) -> None:
        super().__init__(store, folder, command=None)
        self.budget = float(DEFAULT_BUDGET if budget is None else budget)
        self.procs: dict[int, ForkedChunk] = {}

    def is_process_of(self, pid: int, run: dict[str, Any]) -> bool:
        return is_chunk_of(pid, run["id"])

    def start(self, run: dict[str, Any], devices: list[str], env: dict[str, str]) -> bool:
        """Claim the run and fork its next chunk. False when it could not be claimed (no longer queued, or a spec
        that fails at once: then it failed)."""
        run_id, data_dir = run["id"], self.folder.root
        if chunks.claim(self.store, data_dir, run, pid=os.getpid(), devices=",".join(devices)) is None:
            return False
        log_path = self.folder.run_log(run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} chunk {run['chunks_done'] + 1} of run {run_id} "
                      f"(forked, {self.budget:g} s)\n".encode())
        pid = fork_chunk(data_dir, run_id, self.budget, env, log_path)
        self.procs[run_id] = ForkedChunk(pid)
        self.store.update_run(run_id, pid=pid)
        self.store.add_log(run_id, f"Chunk {run['chunks_done'] + 1} started (forked process {pid}, devices "
                                   f"{','.join(devices)}, {self.budget:g} s of work); its output is in {log_path}.")
        return True

    def ending(self, run: dict[str, Any]) -> Ending | None:
        proc = self.procs.get(run["id"])
        if proc is not None:
            code = proc.poll()
            if code is None or run["status"] not in lifecycle.LIVE or run["pid"] != proc.pid:
                return None  # runs, or settled already, or the run names another process
            how = "exited" if code == 0 else f"exited with code {code}"
            return Ending(EXITED, how, f"Its chunk process {exit_text(code) if code < 0 else how}.")
        if self.alive(run):
            return None
        return Ending(FAILED, f"(pid {run['pid']}) is gone", f"Its chunk process (pid {run['pid']}) is gone.")

    def ask_to_stop(self, run: dict[str, Any]) -> None:
        """The chunk's stop file, and SIGTERM to a forked chunk."""
        journal.request_stop(self.folder.root, run["id"])
        pid = self.pid(run)
        if pid is not None:
            signal_process(pid, signal.SIGTERM)

    def gone_unwatched(self, run: dict[str, Any]) -> str:
        return "was gone when the studio started"

    def followed_elsewhere(self, run: dict[str, Any]) -> str | None:
        return None

    def follow(self, run: dict[str, Any]) -> None:
        chunks.ingest(self.store, self.folder.root, run["id"])

    def settle(self, run: dict[str, Any], how: str) -> str:
        return chunks.settle(self.store, self.folder.root, run["id"], how, paused=self.paused)



def _null_descriptors() -> None:
    """Point every inherited descriptor above 2 at /dev/null: the child lets go of the server's socket, the
    scheduler's lock, the database's files and the pipes of other processes (a child holding them would keep the
    port, the lock or a pipe's other end alive after the studio exits), while the numbers stay taken, so an
    inherited object that closes its descriptor later cannot close a file this chunk opened since."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd > 2 and fd != null:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)


def _child(data_dir: str, run_id: int, budget_seconds: float, env: dict[str, str], log_path: str) -> int:
    """The forked chunk process: a session of its own, the run's log as its output, the workers' environment,
    SIGTERM as a stop request, and the chunk in a thread of its own. Returns the exit status (0: the chunk wrote
    how it ended)."""
    import gc

    # Nothing inherited is ever collected here: a finalizer of an object of the parent's (a database connection
    # of a dropped engine, say) must not run in the child.
    gc.freeze()
    os.setsid()
    # In the workers' folder from the start: it names the studio a process belongs to (`app.runtime.scheduler`).
    worker_directory(data_dir).__enter__()
    _null_descriptors()
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # Fresh stream objects and logging handlers: another thread of the parent may have held their locks at the fork.
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - for the life of the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [chunk]: %(message)s"))
    root.addHandler(stream)
    with contextlib.suppress(ImportError, AttributeError):
        from tqdm import tqdm

        if hasattr(tqdm, "_lock"):
            del tqdm._lock  # tqdm's multiprocessing lock, possibly held by a parent thread at the fork
    os.environ.clear()
    os.environ.update(env)
    from a2po._faults import rearm

    rearm()
    stop_event = threading.Event()
    # Only set a flag: the handler runs between two bytecodes of this (main) thread.
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())
    for name in ("SIGHUP", "SIGPIPE"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result.update(run_chunk(data_dir, run_id, budget_seconds, stop_event=stop_event))
        except BaseException:  # noqa: BLE001 - printed to the run's log; the parent settles the run
            traceback.print_exc()

    # As on ZeroGPU, the chunk runs in a thread that is not the process's first.
    thread = threading.Thread(target=work, name=f"chunk-{run_id}")
    thread.start()
    while thread.is_alive():
        thread.join(timeout=0.5)
    print(f"Chunk of run {run_id} ended: {result.get('outcome', 'no result')}.", flush=True)
    return 0 if result else 1


def fork_chunk(data_dir: str | os.PathLike[str], run_id: int, budget_seconds: float, env: dict[str, str],
               log_path: str | os.PathLike[str]) -> int:
    """Run one chunk of a claimed run in a freshly forked copy of this process; returns the child's pid (reap it
    with `os.waitpid`). The parent must not have started torch threads (see the module docstring)."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # else the child would write the parent's buffered text again
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        # Named at once and for its whole life: a studio that starts now sees this process as the run's chunk.
        named_thread(thread_name(run_id)).__enter__()
        code = _child(str(data_dir), int(run_id), float(budget_seconds), dict(env), str(log_path))
    except BaseException:  # noqa: BLE001 - whatever happens, the child must never return into the parent's code
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return 0  # not reached


class ForkedChunk:
    """A forked chunk process as `app.runtime.scheduler` handles worker processes (`subprocess.Popen`'s `pid`, `poll`,
    `wait`, `returncode`: negative for a signal)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL  # reaped elsewhere: it is gone
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"chunk process {self.pid} still runs")
            time.sleep(0.05)
        return self.returncode
