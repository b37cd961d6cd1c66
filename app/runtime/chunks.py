"""Chunked runs: one run spec executed as a sequence of short chunks, each a plain function call that restores the
run from disk, works until its time budget is spent, and saves it again, never touching the database: the parent
claims the run (`claim`), applies the chunk's journal (`ingest`) and settles the run when the chunk returns or dies
(`settle`). Who the parent is, and the rules: docs/runtime.md, "Chunked runs".
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import traceback
from typing import Any

from app.runtime import journal
from app.runtime.checkpoints import remove_checkpoints
from app.runtime.data_folder import DataFolder
from app.runtime.value_sets import ensure_value_set, uses_values
from app.runtime.worker import Heartbeat, StopRequested, disk_full, run_job
from storage import Store, lifecycle
from storage.secrets import scrub_text

READY = lifecycle.WAITING  # what a chunk may start on (a paused run is unpaused first)
DEFAULT_BUDGET = 40.0  # seconds of work per chunk
DISK_FULL_OUTCOME = "disk_full"  # a chunk's end: it met a full disk; settled as a lost chunk, not a failed run
# Seconds a chunk takes beyond its budget, at most: restoring the run (model, optimizer, V*), the step under way at
# the deadline, the final checkpoint. A GPU call asks for budget + margin (`app.runtime.zerogpu.gpu_duration`).
CHUNK_MARGIN = 20.0
THREAD_NAME_PREFIX = "a2po-c"  # /proc/<pid>/task/*/comm of a chunk's thread: "a2po-c<run id>" (15 chars max)
PR_SET_NAME, PR_GET_NAME = 15, 16  # prctl(2)

logger = logging.getLogger("app.runtime.chunks")


def is_chunked(run_or_spec: dict[str, Any] | None) -> bool:
    """True for a run row (its config) or a spec whose runner is "chunked"."""
    if not run_or_spec:
        return False
    spec = run_or_spec.get("config") if "config" in run_or_spec and "action" in run_or_spec else run_or_spec
    return isinstance(spec, dict) and spec.get("runner") == "chunked"


def thread_name(run_id: int) -> str:
    return f"{THREAD_NAME_PREFIX}{int(run_id)}"[:15]


def is_chunk_of(pid: int | None, run_id: int) -> bool:
    """True unless /proc shows that no thread of process `pid` runs a chunk of `run_id` (a chunk, and the page
    driving a ZeroGPU chunk, name their thread `thread_name`; the process itself is a fork of the studio, with the
    studio's command line)."""
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
def named_thread(name: str):
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
def _run_logging(ledger: journal.ChunkLedger, run_id: int):
    """Log lines of `app` and `a2po` (INFO and up) and of everything else (WARNING and up) into the run's log while
    the chunk runs; everything as it was afterwards (a ZeroGPU worker process may serve the next call)."""
    from app.runtime.recorder import StoreLogHandler

    handler = StoreLogHandler(ledger, run_id)
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


@contextlib.contextmanager
def worker_directory(data_dir: str | os.PathLike[str]):
    """Work in the workers' empty folder (`<data-dir>/cache/worker-cwd`): a hub id such as "runs/run-3" must
    never name a folder relative to the studio's working directory."""
    folder = DataFolder(data_dir).make_worker_cwd()
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            os.chdir(before)


# ------------------------------------------------------------------------------------------------ the chunk


def run_chunk(data_dir: str | os.PathLike[str], run_id: int, budget_seconds: float = DEFAULT_BUDGET,
              stop_event: threading.Event | None = None) -> dict[str, Any]:
    """One chunk of run `run_id`, claimed by the parent, whose input it reads (see the module docstring). Returns
    plain data: `run_id`, `outcome` ("continues": budget spent; "finished", "stopped", "failed"; "disk_full": it
    met a full disk, and the next chunk goes on; "not-started": no input for it) and `seconds`. The same goes into
    the journal's last line. `stop_event` (optional) asks for a stop as SIGTERM asks a worker. Never opens the
    database."""
    from a2po.callbacks import StageInterrupted

    started = time.monotonic()
    run_id = int(run_id)
    stop_event = stop_event or threading.Event()
    try:
        ledger = journal.ChunkLedger(data_dir, run_id)
    except FileNotFoundError:
        return {"run_id": run_id, "outcome": "not-started", "seconds": 0.0}
    outcome, error, seconds = "failed", None, 0.0
    try:
        run = ledger.get_run(run_id)
        with named_thread(thread_name(run_id)), worker_directory(data_dir), \
                _run_logging(ledger, run_id) as log_handler:
            heartbeat = Heartbeat(ledger, run_id, stop_event, log_handler)
            heartbeat.start()
            number = int(run.get("chunks_done") or 0) + 1
            logger.info("Run %s: chunk %d (pid %d, budget %.0f s).", run_id, number, os.getpid(), budget_seconds)
            try:
                outcome = run_job(ledger, run, data_dir, stop_event, deadline=started + float(budget_seconds))
            except (StopRequested, StageInterrupted) as stop:
                outcome = "stopped" if stop_event.is_set() else "continues"
                if outcome == "stopped":
                    logger.info("Run %s: %s", run_id, stop)
            except Exception as failure:
                error = traceback.format_exc()
                if disk_full(failure):  # the next chunk goes on from the last complete checkpoint, as a lost one
                    outcome = DISK_FULL_OUTCOME
                    logger.warning("Run %s: chunk %d met a full disk:\n%s", run_id, number, error)
                else:
                    logger.error("Run %s failed in chunk %d:\n%s", run_id, number, error)
            finally:
                heartbeat.stop()
                seconds = time.monotonic() - started
                logger.info("Run %s: chunk %d took %.1f s (%s).", run_id, number, seconds, outcome)
        ledger.end(outcome, error, round(seconds, 3))
    finally:
        ledger.close()
    return {"run_id": run_id, "outcome": outcome, "seconds": round(seconds, 3)}


# ------------------------------------------------------------------------------------------------ the parent

_ingesting: dict[int, threading.Lock] = {}
_ingesting_guard = threading.Lock()


def _ingest_lock(run_id: int) -> threading.Lock:
    with _ingesting_guard:
        return _ingesting.setdefault(int(run_id), threading.Lock())


def claim(store: Store, data_dir: str | os.PathLike[str], run: dict[str, Any], pid: int,
          devices: str | None = None) -> dict[str, Any] | None:
    """Before a chunk: claim the queued run for process `pid` (`lifecycle.CLAIM`), make sure it has its value set,
    and write the chunk's input. Returns the claimed run, or None when it was not queued any more."""
    from a2po.runspec import RunSpec

    run_id = run["id"]
    if not store.apply(run_id, lifecycle.CLAIM, pid=pid, devices=devices):
        return None
    journal.clear(data_dir, run_id)  # an earlier chunk's journal was settled; nothing writes it now
    store.reset_journal(run_id)
    try:
        spec = RunSpec.from_dict(run["config"])
        if uses_values(spec):
            ensure_value_set(store, store.get_run(run_id), spec)
        claimed = store.get_run(run_id)
        journal.write_input(store, data_dir, claimed)
        return claimed
    except Exception:  # noqa: BLE001 - the spec cannot run: fail it with the reason, not a silent queue
        store.apply(run_id, lifecycle.FAIL, error=traceback.format_exc())
        return None


def ingest(store: Store, data_dir: str | os.PathLike[str], run_id: int) -> dict[str, Any] | None:
    """Apply the new complete lines of the run's journal to the database (exactly once: the position is stored in
    the same transaction). Returns the chunk's end line when it was among them, else None."""
    with _ingest_lock(run_id):
        run = store.get_run(run_id)
        if run is None:
            return None
        entries, offset = journal.read_new(journal.journal_path(data_dir, run_id), int(run["journal_offset"] or 0))
        if not entries:
            return None
        ops, end = [], None
        for entry in entries:
            if journal.END in entry:
                end = entry[journal.END]
            elif "op" in entry:
                kwargs = {k: v for k, v in entry.items() if k != "op"}
                ops.append((entry["op"], kwargs))
        store.apply_journal(run_id, ops, offset)
        return end


def started(data_dir: str | os.PathLike[str], run_id: int) -> bool:
    """Whether the run's current chunk wrote anything to its journal."""
    try:
        return journal.journal_path(data_dir, run_id).stat().st_size > 0
    except FileNotFoundError:
        return False


def ended(store: Store, data_dir: str | os.PathLike[str], run_id: int) -> dict[str, Any] | None:
    """The end line of the run's current journal, if the chunk wrote one (read after its process is gone)."""
    entries, _ = journal.read_new(journal.journal_path(data_dir, run_id), 0)
    return next((e[journal.END] for e in reversed(entries) if journal.END in e), None)


def settle(store: Store, data_dir: str | os.PathLike[str], run_id: int, how: str, *, paused: bool = False) -> str:
    """After a chunk's process is gone (returned, exited or died): apply the rest of its journal, then move the run
    on as the chunk ended it, or as a lost chunk when it wrote no end (`how` says what happened to its process;
    `paused`: ZeroGPU, where a page drives the next chunk). Returns the outcome recorded. Idempotent."""
    ingest(store, data_dir, run_id)
    run = store.get_run(run_id)
    if run is None:  # deleted while its chunk ran: what the chunk wrote since goes too
        journal.clear(data_dir, run_id)
        shutil.rmtree(DataFolder(data_dir).run_output(run_id), ignore_errors=True)
        return "gone"
    end = ended(store, data_dir, run_id)
    outcome = "lost"
    if run["status"] not in lifecycle.LIVE:
        outcome = run["status"]  # settled already
    elif end is not None and end["outcome"] == DISK_FULL_OUTCOME:
        lines = (end.get("error") or "").strip().splitlines()
        last = lines[-1] if lines else "no error text"  # the traceback's last line: the exception itself
        outcome = _chunk_lost(store, data_dir, run, f"met a full disk ({last})", paused)
    elif end is not None:
        outcome, seconds = end["outcome"], float(end.get("seconds") or 0.0)
        if outcome == "continues":
            # Back in the queue at its old place (queued_at unchanged): it goes on next.
            if not store.apply(run_id, lifecycle.YIELD, seconds=seconds):
                outcome = "stopped"  # asked to stop as the chunk ended: the checkpoint is written
                store.apply(run_id, lifecycle.end_event("stopped", run.get("stop_reason")), seconds=seconds)
        else:
            fields: dict[str, Any] = {"error": end.get("error")}
            if outcome == "finished":
                fields.update(progress=1.0, stage=None)
            store.apply(run_id, lifecycle.end_event(outcome, run.get("stop_reason")), seconds=seconds, **fields)
            if outcome == "finished":
                remove_checkpoints(store, run_id)
    else:
        outcome = _chunk_lost(store, data_dir, run, how, paused)
    journal.clear(data_dir, run_id)
    store.reset_journal(run_id)
    return outcome


def _chunk_lost(store: Store, data_dir: str | os.PathLike[str], run: dict[str, Any], how: str, paused: bool) -> str:
    """A chunk's process died without writing how it ended: what it wrote stays (V* rows, checkpoints), and the
    run waits for its next chunk, at most `MAX_AUTO_RESUMES` times in a row."""
    run_id, now = run["id"], time.time()
    seconds = max(0.0, now - (run["started_at"] or now))
    if run["status"] == lifecycle.STOPPING:
        store.apply(run_id, lifecycle.end_event("stopped", run.get("stop_reason")), seconds=seconds,
                    error=f"Stopped: its chunk process {how}.")
        return "stopped"
    failures = int(run["auto_resumes"] or 0) + 1
    if run.get("stage") == "eval":
        how += (" while evaluating: one evaluation may take longer than a chunk may last (lower eval_size or "
                "per_device_eval_batch_size, or give chunks more time with --chunk-seconds)")
    if not lifecycle.may_auto_resume(run):
        message = (f"Chunk processes of this run died {failures} times in a row (the last {how}); giving up. Last "
                   f"lines of its output:\n{scrub_text(DataFolder(data_dir).log_tail(run_id), data_dir)}")
        if store.apply(run_id, lifecycle.FAIL, seconds=seconds, error=message):
            store.add_log(run_id, message, level="ERROR")
        return "failed"
    event = lifecycle.CHUNK_LOST_PAUSED if paused else lifecycle.CHUNK_LOST
    if store.apply(run_id, event, seconds=seconds):
        store.add_log(run_id, f"Its chunk process {how} ({failures} of {lifecycle.MAX_AUTO_RESUMES} in a row): the "
                              "next chunk continues from the last checkpoint and the stored V* values.",
                      level="WARNING")
    return "lost"


def progress_of(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Where a run stands, as plain data: chunks and their seconds, prompts with V* (and how many there will be,
    when the spec says), the last training step and the run's `max_steps`."""
    spec = run.get("config") or {}
    dataset = spec.get("dataset") or {}
    expected = None
    if dataset.get("num_prompts"):
        expected = int(dataset["num_prompts"]) + int(dataset.get("eval_size") or 0)
    prompts = sum((run.get("value_counts") or {}).values())  # the run's own V* rows
    steps = [m["step"] for m in store.latest_metrics(run["id"]).values() if m["step"] is not None] if run else []
    max_steps = (spec.get("config") or {}).get("max_steps")
    return {"run_id": run["id"], "status": run["status"], "stage": run.get("stage"),
            "progress": run.get("progress") or 0.0, "chunks_done": run.get("chunks_done") or 0,
            "chunk_seconds": round(float(run.get("chunk_seconds") or 0.0), 3), "prompts_done": prompts,
            "prompts_total": expected, "step": max(steps, default=0),
            "max_steps": max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
            "error": run.get("error")}
