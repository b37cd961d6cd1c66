"""Chunked runs: one run spec executed as a sequence of short chunks, each a plain function call that restores the
run from disk, works until its time budget is spent, and saves it again (what a ZeroGPU Space allows: a GPU only
inside short `@spaces.GPU` calls, each in a forked process, see `app.zerogpu`).

`run_chunk(db_path, data_dir, run_id, budget_seconds)` is the chunk. It opens its own database engine, claims the
run (queued or paused -> running, with its own pid), and runs the worker's job (`app.worker.run_job`) with a
deadline: the job already resumes everything (stage 1 samples only the prompts missing from the stored V* set,
each prompt's samples a function of the seed and the prompt; stage 2 restores the weights or the LoRA adapter, the
optimizer, the scheduler, the RNG and the data position from the newest complete checkpoint), and the recorder
(`app.recorder.StoreRecorder`) stops it at the deadline as it stops it on a user's request: stage 1 after the last
batch that ends in time, stage 2 after the last step that does, through the trainer's control (`max_steps` and the
schedule are the run's), with a full checkpoint. The run then goes back to "queued" (keeping its place at the head
of the queue) with one more chunk and the chunk's seconds counted (`runs.chunks_done`, `runs.chunk_seconds`), or
ends as the worker ends it: finished, stopped, failed. Nothing is kept in memory between two calls; a call returns
plain data. Every chunk makes progress: at least one stage-1 batch or one training step, whatever the budget.

Who calls it:

- the scheduler (`app.jobs`, a spec with `"runner": "chunked"`), chunk after chunk, each in a freshly forked copy
  of the studio's process (`fork_chunk`): its own session, its output in the run's log file, the workers'
  environment (no credentials), every inherited descriptor (the server's socket, the scheduler's lock) pointed at
  /dev/null, the chunk run in a thread of its own as ZeroGPU runs it, SIGTERM asking for a stop;
- on a ZeroGPU Space, the Run page of the visitor who launched it, through the `@spaces.GPU` wrapper of
  `app.zerogpu` (the visitor's request pays the GPU time).

A fork copies the parent's memory, so the parent must not have started torch's OpenMP threads: a forked child
then hangs in its first parallel operation (measured: GNU libgomp, torch 2.13). The studio's process never runs a
torch operation (models load only in workers, chunks and the playground's own process); only the chunk does.
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

from storage import Store

READY = ("queued", "paused")  # what a chunk may claim
DEFAULT_BUDGET = 40.0  # seconds of work per chunk
# Seconds a chunk takes beyond its budget, at most: restoring the run (model, optimizer, V*), the step under way at
# the deadline, the final checkpoint. A GPU call asks for budget + margin (`app.zerogpu.gpu_duration`).
CHUNK_MARGIN = 20.0
THREAD_NAME_PREFIX = "a2po-c"  # /proc/<pid>/task/*/comm of a chunk's thread: "a2po-c<run id>" (15 chars max)
PR_SET_NAME, PR_GET_NAME = 15, 16  # prctl(2)

logger = logging.getLogger("app.chunks")


def is_chunked(run_or_spec: dict[str, Any] | None) -> bool:
    """True for a run row (its config) or a spec whose runner is "chunked"."""
    if not run_or_spec:
        return False
    spec = run_or_spec.get("config") if "config" in run_or_spec and "kind" in run_or_spec else run_or_spec
    return isinstance(spec, dict) and spec.get("runner") == "chunked"


def thread_name(run_id: int) -> str:
    return f"{THREAD_NAME_PREFIX}{int(run_id)}"[:15]


def is_chunk_of(pid: int | None, run_id: int) -> bool:
    """True unless /proc shows that no thread of process `pid` runs a chunk of `run_id` (a chunk names its thread,
    `thread_name`; the process itself may be a ZeroGPU worker or a fork of the studio, with the studio's command
    line)."""
    if not pid:
        return False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc (macOS): trust the pid
    name = thread_name(run_id)
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() == name:
                    return True
        except OSError:
            continue
    return False


@contextlib.contextmanager
def _named_thread(name: str):
    """Name the calling OS thread (Linux `prctl`), restoring its old name afterwards."""
    libc, old = None, None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        buffer = ctypes.create_string_buffer(16)
        if libc.prctl(PR_GET_NAME, buffer, 0, 0, 0) == 0:
            old = buffer.value
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        libc = None
    try:
        yield
    finally:
        if libc is not None and old is not None:
            libc.prctl(PR_SET_NAME, old, 0, 0, 0)


@contextlib.contextmanager
def _run_logging(store: Store, run_id: int):
    """Log lines of `app` and `a2po` (INFO and up) and of everything else (WARNING and up) into the run's log while
    the chunk runs; everything as it was afterwards (a ZeroGPU worker process may serve the next call)."""
    from app.recorder import StoreLogHandler

    handler = StoreLogHandler(store, run_id)
    loggers = [logging.getLogger(name) for name in ("app", "a2po")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        if lg.getEffectiveLevel() > logging.INFO:
            lg.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        handler.flush()
        logging.getLogger().removeHandler(handler)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def progress_of(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Where a run stands, as plain data: chunks and their seconds, prompts with V* (and how many there will be,
    when the spec says), the last training step and the run's `max_steps`."""
    spec = run.get("config") or {}
    dataset = spec.get("dataset") or {}
    expected = None
    if dataset.get("num_prompts"):
        expected = int(dataset["num_prompts"]) + int(dataset.get("eval_size") or 0)
    prompts = store.count_values(run["value_set_id"], None) if run.get("value_set_id") else 0
    steps = [m["step"] for m in store.latest_metrics(run["id"]).values() if m["step"] is not None] if run else []
    max_steps = (spec.get("config") or {}).get("max_steps")
    return {"run_id": run["id"], "status": run["status"], "stage": run.get("stage"),
            "progress": run.get("progress") or 0.0, "chunks_done": run.get("chunks_done") or 0,
            "chunk_seconds": round(float(run.get("chunk_seconds") or 0.0), 3), "prompts_done": prompts,
            "prompts_total": expected, "step": max(steps, default=0),
            "max_steps": max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
            "error": run.get("error")}


def run_chunk(db_path: str | os.PathLike[str], data_dir: str | os.PathLike[str], run_id: int,
              budget_seconds: float = DEFAULT_BUDGET, stop_event: threading.Event | None = None) -> dict[str, Any]:
    """Run one chunk of run `run_id` (see the module docstring) and return where the run stands (`progress_of`),
    with `outcome`: "continues" (budget spent, queued for the next chunk), "finished", "stopped", "failed", or
    "not-started" (the run was not queued or paused: running elsewhere, stopped, finished, deleted, not chunked),
    and `seconds`: this chunk's duration. `stop_event` (optional) asks for a stop as SIGTERM asks a worker."""
    from a2po.callbacks import StageInterrupted
    from app.worker import Heartbeat, StopRequested, record_end, run_job

    started = time.monotonic()
    stop_event = stop_event or threading.Event()
    store = Store(db_path)
    try:
        run = store.get_run(int(run_id))
        if run is None:
            return {"run_id": int(run_id), "status": "gone", "outcome": "not-started", "seconds": 0.0}
        if not is_chunked(run) or run["status"] not in READY:
            return {**progress_of(store, run), "outcome": "not-started", "seconds": 0.0}
        now = time.time()
        if not store.transition(run_id, READY, status="running", pid=os.getpid(), started_at=now, heartbeat_at=now,
                                progress_at=now, finished_at=None, error=None, stop_reason=None):
            return {**progress_of(store, store.get_run(run_id) or run), "outcome": "not-started", "seconds": 0.0}
        number = (run.get("chunks_done") or 0) + 1
        outcome, error = "failed", None
        with _named_thread(thread_name(run_id)), _run_logging(store, run_id) as log_handler:
            heartbeat = Heartbeat(store, run_id, stop_event, log_handler)
            heartbeat.start()
            logger.info("Run %s: chunk %d (pid %d, budget %.0f s).", run_id, number, os.getpid(), budget_seconds)
            try:
                outcome = run_job(store, store.get_run(run_id), data_dir, stop_event,
                                  deadline=started + float(budget_seconds))
            except (StopRequested, StageInterrupted) as stop:
                outcome = "stopped" if stop_event.is_set() else "continues"
                if outcome == "stopped":
                    logger.info("Run %s: %s", run_id, stop)
            except Exception:
                error = traceback.format_exc()
                logger.error("Run %s failed in chunk %d:\n%s", run_id, number, error)
            finally:
                heartbeat.stop()
                seconds = time.monotonic() - started
                logger.info("Run %s: chunk %d took %.1f s (%s).", run_id, number, seconds, outcome)
        store.add_chunk(run_id, seconds)
        if outcome == "continues":
            # Back in the queue at its old place (queued_at unchanged): it goes on next. A chunk that got this far
            # ends a series of chunks that died (`app.jobs` counts them in auto_resumes).
            if not store.transition(run_id, "running", status="queued", pid=None, devices=None, auto_resumes=0,
                                    heartbeat_at=time.time()):
                outcome = "stopped"  # asked to stop as the chunk ended: the checkpoint is written
                record_end(store, run_id, "stopped", None)
        else:
            record_end(store, run_id, outcome, error)
        return {**progress_of(store, store.get_run(run_id) or run), "outcome": outcome,
                "seconds": round(seconds, 3)}
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------------- forked mode


def _null_descriptors() -> None:
    """Point every inherited descriptor above 2 at /dev/null: the child lets go of the server's socket, the
    scheduler's lock and the pipes of other processes (a child holding them would keep the port, the lock or a
    pipe's other end alive after the studio exits), while the numbers stay taken, so an inherited object that
    closes its descriptor later cannot close a file this chunk opened since."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd > 2 and fd != null:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)


def _child(db_path: str, data_dir: str, run_id: int, budget_seconds: float, env: dict[str, str],
           log_path: str) -> int:
    """The forked chunk process: a session of its own, the run's log as its output, the workers' environment,
    SIGTERM as a stop request, and the chunk in a thread of its own. Returns the exit status (0: the chunk
    recorded how it ended)."""
    os.setsid()
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
    from a2po import faults

    faults.rearm()
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
            result.update(run_chunk(db_path, data_dir, run_id, budget_seconds, stop_event=stop_event))
        except BaseException:  # noqa: BLE001 - printed to the run's log; the scheduler settles the run
            traceback.print_exc()

    # As on ZeroGPU, the chunk runs in a thread that is not the process's first.
    thread = threading.Thread(target=work, name=f"chunk-{run_id}")
    thread.start()
    while thread.is_alive():
        thread.join(timeout=0.5)
    print(f"Chunk of run {run_id} ended: {result.get('outcome', 'no result')}.", flush=True)
    return 0 if result else 1


def fork_chunk(db_path: str | os.PathLike[str], data_dir: str | os.PathLike[str], run_id: int,
               budget_seconds: float, env: dict[str, str], log_path: str | os.PathLike[str]) -> int:
    """Run one chunk in a freshly forked copy of this process; returns the child's pid (reap it with
    `os.waitpid`). The parent must not have started torch threads (see the module docstring)."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # else the child would write the parent's buffered text again
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _child(str(db_path), str(data_dir), int(run_id), float(budget_seconds), dict(env), str(log_path))
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
    """A forked chunk process as `app.jobs` handles worker processes (`subprocess.Popen`'s `pid`, `poll`, `wait`,
    `returncode`: negative for a signal)."""

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
