"""One studio job in its own process: `python -m app.runtime.worker --db PATH --run-id N --data-dir DIR`.

It claims the queued run, runs its action with a `StoreRecorder` attached, beats a heartbeat, stops gracefully on
SIGTERM, and records how the run ended. How it resumes, shares V* sets and runs as several processes:
docs/runtime.md, "The worker".

The scheduler's process imports this module (`HEARTBEAT_INTERVAL`, and `app.runtime.chunks` runs its jobs) and never
imports torch: what needs it (the library's trainers and callbacks, accelerate, the recorder) is imported in the
functions that run a job.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from a2po._faults import fault_point
from a2po.sweep import rung_share
from app.runtime import reward_versions
from app.runtime.checkpoints import (
    evaluation_pending,
    remove_checkpoints,
    restore_final,
    resume_checkpoint,
    trained_to_the_end,
)
from app.runtime.credentials import drop_secrets, with_store_password
from app.runtime.data_folder import DataFolder, folder_problem
from app.runtime.devices import visible_gpus
from app.runtime.value_sets import (
    charge_reused_values,
    ensure_value_set,
    record_reused_values,
    stage_one_spent,
    update_value_set,
    uses_values,
)
from storage import Store, lifecycle

# Seconds between heartbeats; `app.runtime.scheduler` calls a worker dead after many missed ones.
HEARTBEAT_INTERVAL = 2.0
OUTSIDE_STOP = ("The worker was stopped from outside the studio (a SIGTERM nobody in the studio sent: its Ray job "
                "stopped, its node drained, or a kill by hand); it saved a checkpoint and the studio resumes it.")
DISK_FULL = ("The disk under the data folder filled while the run wrote to it ({what}). The run is interrupted, not "
             "failed: the studio queues it again, holds the queue while the disk is full, and resumes it from its "
             "latest complete checkpoint once space is free (delete finished runs' files or other files to free it).")
END_WRITE_ATTEMPTS = 60  # tries to record how the run ended (a locked database waits up to 30 s per try)
CLAIM_WAIT = 600.0  # seconds the other processes of a multi-process run wait for the main one to claim it
PR_SET_PDEATHSIG = 1  # prctl(2)

logger = logging.getLogger("app.runtime.worker")


class StopRequested(Exception):
    """The run was asked to stop between two phases of the job."""


class Heartbeat(threading.Thread):
    """Marks the run alive every `interval` seconds, turns an in-process stop request into status "stopping",
    and flushes `log_handler` (so buffered log lines show up even while training logs nothing new)."""

    def __init__(self, store: Store, run_id: int, stop_event: threading.Event, log_handler=None,
                 interval: float = HEARTBEAT_INTERVAL) -> None:
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.store, self.run_id, self.stop_event, self.interval = store, run_id, stop_event, interval
        self.log_handler = log_handler
        self._done = threading.Event()
        self._stop_recorded = False

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.store.heartbeat(self.run_id)
                if self.stop_event.is_set() and not self._stop_recorded:
                    self._stop_recorded = True
                    self.store.apply(self.run_id, lifecycle.REQUEST_STOP)
                if self.log_handler is not None:
                    self.log_handler.flush()
            except Exception as error:  # noqa: BLE001 - a busy database must not kill the heartbeat for good
                logger.warning("Heartbeat of run %s failed: %s", self.run_id, error)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def process_rank() -> tuple[int, int]:
    """(rank, number of processes) of this worker: (0, 1) alone, else as `accelerate launch` set them."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def gpu_problem(use_cpu: bool = False, environ: dict[str, str] | os._Environ | None = None) -> str | None:
    """Why this process cannot use the GPUs it was given (`CUDA_VISIBLE_DEVICES`, set by the scheduler or Ray), or
    None. Without this check a worker whose torch sees no GPU trains on the CPU, many times slower, and says
    nothing. `use_cpu`: the run asked for the CPU (its `use_cpu` setting), so the GPUs do not matter."""
    given = visible_gpus((os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES"))
    if not given or use_cpu:
        return None
    from a2po.device import cuda_unusable  # torch: the studio's process imports this module without it

    why = cuda_unusable("finds none of them (or the ids name no GPU of this machine)")
    if why is None:
        return None
    return (f"This worker was given GPU(s) {','.join(given)} (CUDA_VISIBLE_DEVICES) but cannot use them: {why}. "
            "Install a torch build for this machine's CUDA driver (https://pytorch.org/get-started/locally/), or, to "
            "train on the CPU, start the studio with --gpus none and CUDA_VISIBLE_DEVICES set to an empty value.")


def _from_main(trainer, value: Any) -> Any:
    """`value` as the main process has it, on every process (one broadcast when there are several)."""
    if trainer.accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value], from_process=0)[0]


def _any_process(trainer, flag: bool) -> bool:
    """True on every process when `flag` is true on any."""
    if trainer.accelerator.num_processes == 1:
        return flag
    from accelerate.utils import gather_object

    return any(gather_object([bool(flag)]))


def stop_on_signal(stop_event: threading.Event):
    """A callback for a process other than the main one: a stop signal (SIGTERM) it got itself asks for a stop as
    the main process's recorder does, and `A2POTrainer` stops every process at the same batch or step.
    (Built here: `a2po` imports transformers, which `app.runtime.scheduler`, importing this module, must not pay
    for.)"""
    from a2po.callbacks import A2POCallback

    class StopOnSignal(A2POCallback):
        stopped = False

        def on_values_batch(self, args, state, control, **kwargs):
            if stop_event.is_set():
                self.stopped = control.should_training_stop = True

        def on_step_end(self, args, state, control, **kwargs):
            if stop_event.is_set():
                self.stopped = control.should_training_stop = control.should_save = control.should_log = True

    return StopOnSignal()


def _stage_one(store: Store, run: dict[str, Any], spec: Any, trainer: Any, recorder: Any, check_stop) -> None:
    """A*-PO's stage 1: the run's value set, the V* rows it already holds handed to the trainer, and the rest
    sampled, for every split the action needs. `recorder` is None on a process other than the main one."""
    args = trainer.args
    main = recorder is not None
    value_set_id = None
    if main:
        value_set_id = recorder.value_set_id = ensure_value_set(store, run, spec)
    value_set_id = _from_main(trainer, value_set_id)

    # Hand the stored V* rows to the trainer, so stage 1 samples only what is missing.
    splits = {"train": trainer.train_dataset, **trainer.eval_sets()} if trainer.train_dataset is not None \
        else trainer.eval_sets()
    known = {name: [row for row in store.get_values(value_set_id, name) if row["rewards"]] for name in splits}
    if trainer.accelerator.num_processes > 1:
        # The rows the main process read, on every process (another run may add rows to a shared value set
        # meanwhile): the processes must agree on what is pending, or their shards would overlap.
        ids = _from_main(trainer, {name: sorted(row["prompt_id"] for row in rows) for name, rows in known.items()})
        for name, rows in known.items():
            by_id = {row["prompt_id"]: row for row in rows}
            if not set(ids[name]) <= set(by_id):
                raise RuntimeError(f"Stage 1 ({name}): V* rows the main process read are missing here.")
            known[name] = [by_id[pid] for pid in ids[name]]
    for name, rows in known.items():
        trainer.set_optimal_values(rows, name)
    # The run's stage-1 clock continues from what its earlier starts spent (stored after every batch).
    spent = _from_main(trainer, stage_one_spent(store, run["id"]) if main else None)
    for name, cost in spent.items():
        trainer.run_counters.restore_values(name, *cost)
    # Stage 1 for every split the action needs (the eval sets too, so a reused value set covers them).
    needed = [s for s in splits if spec.action != "evaluate" or s != "train"]
    if getattr(spec, "method", "a2po") != "a2po":
        needed = ["train"]  # GRPO's stage 1 only selects its training prompts
    charged = _from_main(trainer, charge_reused_values(store, run, value_set_id, splits, {
        name: known[name] for name in needed if name not in spent}) if main else None)
    for name, cost in charged.items():
        trainer.run_counters.restore_values(name, *cost)
    if main:
        record_reused_values(store, run, splits, {name: known[name] for name in needed}, trainer.stage_one.rules)
    check_stop()

    try:
        for split in needed:
            trainer.estimate_optimal_values(splits[split], split=split)
    finally:
        if main:
            update_value_set(store, value_set_id, splits, args.num_value_samples)


def run_job(store: Store, run: dict[str, Any], data_dir: str | os.PathLike[str],
            stop_event: threading.Event, deadline: float | None = None) -> str:
    """Run a claimed run to its end; returns "finished". Raises on failure, `StopRequested` /
    `a2po.StageInterrupted` when stopped.

    `deadline` (a `time.monotonic()` time; a chunk of `app.runtime.chunks`) stops the run as a stop request does, after
    the last stage-1 batch or training step that ends before it (with a full checkpoint in stage 2), without
    setting `stop_event`: a caller tells the two apart by it.

    Under `accelerate launch` every process runs this: the main one (rank 0) records the run (recorder, value set,
    checkpoints); the others only compute and read the database, and every decision they must share (the value
    set, which V* rows are known, the checkpoint to resume, a stop) comes from the main process or from all."""
    from a2po.runspec import RunSpec
    from app.runtime.recorder import StoreRecorder

    run_id = run["id"]
    main = process_rank()[0] == 0
    spec = RunSpec.from_dict(run["config"])
    problem = gpu_problem(use_cpu=bool(spec.config.get("use_cpu")))
    if problem:
        raise RuntimeError(problem)
    output_dir = DataFolder(data_dir).run_output(run_id)
    output_dir.mkdir(parents=True, exist_ok=True)
    recorder = None
    if main:
        store.update_run(run_id, output_dir=str(output_dir))
        recorder = StoreRecorder(store, run_id, stop_event=stop_event, deadline=deadline)
    stopper = recorder if recorder is not None else stop_on_signal(stop_event)

    def check_stop() -> None:
        wanted = recorder.stop_requested() if recorder is not None else stop_event.is_set()
        if _any_process(trainer, wanted):
            raise StopRequested(f"Run {run_id} was asked to stop.")

    if main:
        logger.info("Run %s: %s %s on %s (output in %s).", run_id, spec.action, spec.model, run["dataset"],
                    output_dir)
    # The store is the one source of truth for V*: the trainer's own jsonl cache would let it skip prompts whose
    # values never reached the database (e.g. a worker killed between the two writes).
    stage_one = {"save_values": False} if uses_values(spec) else {}  # GRPO has no V* cache to turn off
    trainer = spec.build_trainer(output_dir=str(output_dir), callbacks=[stopper], **stage_one)
    trainer.run_counters.budget_share = rung_share(run["config"].get("study"))
    if main and trainer.run_counters.budget_share < 1:
        logger.info("Run %s: rung %s of a halving sweep: it trains on %.3g of its budget's training part.", run_id,
                    run["config"]["study"].get("rung"), trainer.run_counters.budget_share)
    if recorder is not None:
        recorder.touch()  # loading the model counts as progress for the watchdog
    if main:
        # The registered rewards' files may have changed since launch: say which version scores from here on.
        part = f"chunk {int(run.get('chunks_done') or 0) + 1}" if deadline is not None else "this worker"
        part += f" (stage {run['stage']} on)" if run.get("stage") else " (from the start)"
        for level, message in reward_versions.loaded(run["config"].get("rewards") or [], trainer.reward_funcs, part):
            logger.log(level, "%s", message)
    if spec.action == "evaluate" and trainer.eval_dataset is None:
        raise ValueError("An 'evaluate' run needs an eval set: set dataset.eval_size > 0 in the run spec.")
    if uses_values(spec):
        _stage_one(store, run, spec, trainer, recorder, check_stop)
        check_stop()

    if spec.action == "train":
        checkpoint = resume_checkpoint(store, run_id, output_dir) if main else None
        checkpoint = _from_main(trainer, checkpoint)
        if recorder is not None:
            recorder.final_evaluation = trainer.eval_dataset is not None
        if checkpoint:
            evaluated = {e["step"] for e in store.get_evaluations(run_id)} if main else set()
            pending = main and evaluation_pending(trainer, checkpoint, evaluated)
            # An evaluation due at the checkpoint's step that never ran (a chunk left it for the next one) runs
            # first, on the checkpoint's weights.
            trainer.evaluate_on_resume = _from_main(trainer, pending)
            if main:
                logger.info("Run %s: resuming stage 2 from %s.", run_id, checkpoint, extra={"flush_now": True})
        if checkpoint and trained_to_the_end(trainer, checkpoint):
            restore_final(trainer, checkpoint)  # nothing left to train; resuming would train one step more
        else:
            trainer.train(resume_from_checkpoint=checkpoint)
        if _any_process(trainer, stopper.stopped):
            raise StopRequested(f"Run {run_id} stopped at step {trainer.state.global_step}.")
        evaluated = {e["step"] for e in store.get_evaluations(run_id)} if main else set()
        if _from_main(trainer, trainer.eval_dataset is not None and trainer.state.global_step not in evaluated):
            if recorder is not None:
                recorder.set_stage("eval")
            trainer.evaluate()
        trainer.save_model()
        if main:
            # Its checkpoints go once the end is recorded (`remove_checkpoints`), not before: a kill
            # in between still resumes from them.
            logger.info("Run %s: final model saved in %s.", run_id, output_dir)
    elif spec.action == "evaluate":
        if recorder is not None:
            recorder.set_stage("eval")
        trainer.evaluate()
    return "finished"


def record_end(store: Store, run_id: int, status: str, error: str | None) -> bool:
    """Write how the run ended (`lifecycle.end_event`), retrying while the database is busy; False if it could not
    be written (then `app.runtime.scheduler` writes it when it sees this process exit). A stop asked by the studio's own
    shutdown ends "interrupted": it is resumed when the studio starts again. A finished run's checkpoints are
    removed once its end is written."""
    fields: dict[str, Any] = {"error": error}
    if status == "finished":
        fields.update(progress=1.0, stage=None)
    for attempt in range(END_WRITE_ATTEMPTS):
        try:
            fault_point("record_end")
            run = store.get_run(run_id)
            reason = run.get("stop_reason") if run else None
            event = lifecycle.end_event(status, reason)
            # A signal from outside, or a full disk (`error` says so): interrupted, then resumed.
            outside = status == "stopped" and reason is None
            if outside:
                fields.update(stop_reason="lost", error=error or OUTSIDE_STOP)
            # Only a run this worker still owns: a run deleted or failed by the scheduler meanwhile stays so.
            if store.apply(run_id, event, **fields):
                if status == "finished":
                    remove_checkpoints(store, run_id)
                elif outside:
                    store.add_log(run_id, error or OUTSIDE_STOP, level="WARNING")
            return True
        except Exception as failure:  # noqa: BLE001 - a locked or full disk: wait and try again
            logger.warning("Could not record the end of run %s (attempt %d): %s", run_id, attempt + 1, failure)
            time.sleep(min(10.0, 0.5 * 2**attempt))
    return False


def disk_full(failure: BaseException) -> bool:
    """Whether `failure` (or an exception it was raised from) is a write on a full disk: an `OSError` with ENOSPC,
    or a library's wrapping of one that keeps only its text (safetensors' `SafetensorError`, SQLite's "database or
    disk is full")."""
    seen: set[int] = set()
    while failure is not None and id(failure) not in seen:
        seen.add(id(failure))
        if isinstance(failure, OSError) and failure.errno == errno.ENOSPC:
            return True
        text = str(failure)
        if "No space left on device" in text or "os error 28" in text or "database or disk is full" in text:
            return True
        failure = failure.__cause__ or failure.__context__
    return False


def die_with_parent(parent: int) -> None:
    """Linux: have the kernel SIGKILL this process when its parent (the launcher) dies, however it dies (`accelerate
    launch` starts each process in a session of its own, out of reach of a signal to the launcher's group)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):  # not Linux: the scheduler kills the launcher's children itself
        return
    if os.getppid() != parent:  # it died before prctl
        os.kill(os.getpid(), signal.SIGKILL)


def follow(store: Store, run_id: int, data_dir: str, owner: int, stop_event: threading.Event) -> int:
    """A process other than the main one: wait until the main process claimed the run for this launch (`owner`),
    then compute its share. It writes nothing to the database; its output goes to the run's log file."""
    from a2po.callbacks import StageInterrupted

    deadline = time.monotonic() + CLAIM_WAIT
    while True:
        run = store.get_run(run_id)
        if run is not None and run["pid"] == owner and run["status"] in lifecycle.LIVE:
            break
        if run is None or run["status"] != lifecycle.QUEUED or stop_event.is_set() or time.monotonic() > deadline:
            print(f"Run {run_id} is not running for this launch (pid {owner}); nothing to do.", flush=True)
            return 0
        time.sleep(0.1)
    try:
        run_job(store, run, data_dir, stop_event)
    except (StopRequested, StageInterrupted):
        pass
    except Exception:  # noqa: BLE001 - printed to the run's log; the launcher then ends the other processes
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Claim run `--run-id`, run it, and record its end. Exit code 0: finished, stopped or nothing to do.

    Under `accelerate launch` every process runs this: the main one (rank 0) claims the run with the launcher's
    pid, beats the heartbeat, records everything and how the run ended; the others wait for its claim (`follow`)."""
    parser = argparse.ArgumentParser(prog="python -m app.runtime.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the studio database: a SQLite file or a server's URL")
    parser.add_argument("--run-id", type=int, required=True, help="the queued run to execute")
    parser.add_argument("--data-dir", required=True, help="where run outputs go (<data-dir>/runs/run-<id>)")
    options = parser.parse_args(argv)
    drop_secrets()

    rank, world = process_rank()
    # Under `accelerate launch` (several processes) the run belongs to the launcher, this process's parent: its pid
    # is the run's pid (the scheduler started it; it exits when any process of the run fails), and no process of
    # the run outlives it.
    owner = os.getppid() if world > 1 else os.getpid()
    if world > 1:
        die_with_parent(owner)
    where = f" [process {rank} of {world}]" if world > 1 else ""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s")
    store = Store(with_store_password(options.db, options.data_dir))
    run_id = options.run_id
    stop_event = threading.Event()
    # Only set a flag here: the handler runs between two bytecodes of the main thread, maybe mid-transaction.
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())

    fault_point("worker_start")
    if rank > 0:
        return follow(store, run_id, options.data_dir, owner, stop_event)
    if not store.apply(run_id, lifecycle.CLAIM, pid=owner):
        run = store.get_run(run_id)
        state = "does not exist" if run is None else f"is {run['status']}, not queued"
        print(f"Run {run_id} {state} in {options.db}; nothing to do (queue it again to run it).", flush=True)
        return 0

    from app.runtime.recorder import StoreLogHandler

    log_handler = StoreLogHandler(store, run_id)
    logging.getLogger().addHandler(log_handler)
    problem = folder_problem(store.get_run(run_id) or {}, options.data_dir)
    if problem:
        logger.error("Run %s failed: %s", run_id, problem)
        log_handler.flush()
        logging.getLogger().removeHandler(log_handler)
        record_end(store, run_id, "failed", problem)
        return 1
    heartbeat = Heartbeat(store, run_id, stop_event, log_handler)
    heartbeat.start()
    status, error = "failed", None
    try:
        status = run_job(store, store.get_run(run_id), options.data_dir, stop_event)
    except StopRequested as stop:
        status = "stopped"
        logger.info("%s", stop)
    except Exception as failure:
        from a2po.callbacks import StageInterrupted

        if isinstance(failure, StageInterrupted):
            status = "stopped"
            logger.info("Run %s: %s", run_id, failure)
        elif disk_full(failure):
            status, error = "stopped", DISK_FULL.format(what=f"{type(failure).__name__}: {failure}")
            logger.warning("Run %s: the disk is full:\n%s", run_id, traceback.format_exc())
        else:
            error = traceback.format_exc()
            if world > 1:  # often a collective that failed because another process died: its traceback is there
                error += (f"\n(One of the run's {world} processes; the output of every process is in "
                          f"{DataFolder(options.data_dir).run_log(run_id)}.)")
            logger.error("Run %s failed:\n%s", run_id, error)
    finally:
        heartbeat.stop()
        logger.info("Run %s %s.", run_id, status)
        log_handler.flush()
        logging.getLogger().removeHandler(log_handler)
        recorded = record_end(store, run_id, status, error)
    fault_point("worker_exit")
    return 1 if status == "failed" or not recorded else 0


if __name__ == "__main__":
    sys.exit(main())
