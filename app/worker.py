"""One studio job in its own process: `python -m app.worker --db PATH --run-id N --data-dir DIR`.

The worker claims the queued run, builds the trainer from the stored run spec, runs the action ("values",
"train" or "evaluate") with a `StoreRecorder` attached, and records how it ended: finished, stopped, or failed
(with the traceback). A background thread writes a heartbeat every few seconds, so the dashboard can tell a
dead worker from a slow one.

Stage-1 values live in a value set shared by every run with the same V* settings (`RunSpec.value_fingerprint`):
the rows already stored are handed to the trainer (`A2POTrainer.set_optimal_values`), so stage 1 samples only the
prompts still missing (none when the set is complete). SIGTERM (or SIGINT) asks for a graceful stop: the recorder stops
stage 1 after the current batch or stage 2 after the current step, the Trainer writes a full checkpoint, and the
run ends "stopped". Queuing the same run again resumes it: stage 1 continues with the prompts not yet done, and
stage 2 continues from the latest checkpoint.
"""

from __future__ import annotations

import argparse
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

HEARTBEAT_INTERVAL = 2.0  # seconds between heartbeats; `app.jobs` calls a worker dead after many missed ones

logger = logging.getLogger("app.worker")


class StopRequested(Exception):
    """The run was asked to stop between two phases of the job."""


def run_output_dir(data_dir: str | os.PathLike[str], run_id: int) -> Path:
    """Where a run's checkpoints and final model go."""
    return Path(data_dir) / "runs" / f"run-{run_id}"


def run_log_path(data_dir: str | os.PathLike[str], run_id: int) -> Path:
    """The worker's stdout/stderr file (tracebacks of crashes that never reached the database end up here)."""
    return Path(data_dir) / "logs" / f"run-{run_id}.log"


class Heartbeat(threading.Thread):
    """Marks the run alive every `interval` seconds, turns an in-process stop request into status "stopping",
    and flushes `log_handler` (so buffered log lines show up even while training logs nothing new)."""

    def __init__(self, store: Store, run_id: int, stop_event: threading.Event, log_handler=None,
                 interval: float = HEARTBEAT_INTERVAL) -> None:
        super().__init__(name=f"heartbeat-{run_id}", daemon=True)
        self.store, self.run_id, self.stop_event, self.interval = store, run_id, stop_event, interval
        self.log_handler = log_handler
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.store.heartbeat(self.run_id)
                if self.stop_event.is_set():
                    self.store.transition(self.run_id, "running", status="stopping")
                if self.log_handler is not None:
                    self.log_handler.flush()
            except Exception as error:  # noqa: BLE001 - a busy database must not kill the heartbeat for good
                logger.warning("Heartbeat of run %s failed: %s", self.run_id, error)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def value_set_meta(spec, args) -> dict[str, Any]:
    """What a value set was sampled with, for people reading the value-set table."""
    from a2po.runspec import SAMPLING_FIELDS

    return {"model": spec.model, "dataset": spec.dataset, "rewards": spec.rewards, "seed": args.seed,
            "sampling": {k: getattr(args, k) for k in SAMPLING_FIELDS}}


def _update_value_set(store: Store, value_set_id: int, splits: dict[str, Any], num_value_samples: int) -> None:
    """Refresh per-split summaries from the stored rows; mark the set complete once every split has every prompt."""
    from a2po.values import prompt_id_for, summarize

    summary, complete = {}, True
    for split, dataset in splits.items():
        rows = store.get_values(value_set_id, split)
        done = {row["prompt_id"] for row in rows if row["v_star"] is not None}
        complete &= {prompt_id_for(row) for row in dataset.to_list()} <= done
        if rows:
            summary[split] = summarize([r for r in rows if r["v_star"] is not None], num_value_samples)
    if complete:
        store.mark_value_set_complete(value_set_id, summary)
    elif summary:
        store.update_value_set_summary(value_set_id, summary)


def run_job(store: Store, run: dict[str, Any], data_dir: str | os.PathLike[str],
            stop_event: threading.Event) -> str:
    """Run a claimed run to its end; returns "finished". Raises on failure, `StopRequested` /
    `a2po.StageInterrupted` when stopped."""
    from a2po.runspec import RunSpec
    from app.recorder import StoreRecorder

    run_id = run["id"]
    spec = RunSpec.from_dict(run["config"])
    output_dir = run_output_dir(data_dir, run_id)
    output_dir.mkdir(parents=True, exist_ok=True)
    store.update_run(run_id, output_dir=str(output_dir))
    recorder = StoreRecorder(store, run_id, stop_event=stop_event)

    def check_stop() -> None:
        if recorder.stop_requested():
            raise StopRequested(f"Run {run_id} was asked to stop.")

    logger.info("Run %s: %s %s on %s (output in %s).", run_id, spec.action, spec.model, run["dataset"], output_dir)
    # The store is the one source of truth for V*: the trainer's own jsonl cache would let it skip prompts whose
    # values never reached the database (e.g. a worker killed between the two writes).
    trainer = spec.build_trainer(output_dir=str(output_dir), callbacks=[recorder], save_values=False)
    if spec.action == "evaluate" and trainer.eval_dataset is None:
        raise ValueError("An 'evaluate' run needs an eval set: set dataset.eval_size > 0 in the run spec.")
    args = trainer.args
    value_set_id = store.get_or_create_value_set(spec.value_fingerprint(), value_set_meta(spec, args))
    recorder.value_set_id = value_set_id
    store.update_run(run_id, value_set_id=value_set_id)

    # Hand the stored V* rows to the trainer, so stage 1 samples only what is missing.
    splits = {"train": trainer.train_dataset, **trainer.eval_sets()} if trainer.train_dataset is not None \
        else trainer.eval_sets()
    for name in splits:
        trainer.set_optimal_values([row for row in store.get_values(value_set_id, name) if row["rewards"]], name)
    check_stop()

    # Stage 1 for every split the action needs (the eval sets too, so a reused value set covers them).
    needed = [s for s in splits if spec.action != "evaluate" or s != "train"]
    try:
        for split in needed:
            trainer.estimate_optimal_values(splits[split], split=split)
    finally:
        _update_value_set(store, value_set_id, splits, args.num_value_samples)
    check_stop()

    if spec.action == "train":
        checkpoint = _latest_checkpoint(store, run_id)
        if checkpoint:
            logger.info("Run %s: resuming stage 2 from %s.", run_id, checkpoint)
        trainer.train(resume_from_checkpoint=checkpoint)
        if recorder.stopped:
            raise StopRequested(f"Run {run_id} stopped at step {trainer.state.global_step}.")
        evaluated = {e["step"] for e in store.get_evaluations(run_id)}
        if trainer.eval_dataset is not None and trainer.state.global_step not in evaluated:
            recorder.set_stage("eval")
            trainer.evaluate()
        trainer.save_model()
        logger.info("Run %s: final model saved in %s.", run_id, output_dir)
    elif spec.action == "evaluate":
        recorder.set_stage("eval")
        trainer.evaluate()
    return "finished"


def _latest_checkpoint(store: Store, run_id: int) -> str | None:
    """The newest recorded checkpoint that still exists on disk (rotation may have removed some)."""
    for row in sorted(store.list_checkpoints(run_id), key=lambda r: (r["step"], r["id"]), reverse=True):
        if Path(row["path"], "trainer_state.json").is_file():
            return row["path"]
    return None


def main(argv: list[str] | None = None) -> int:
    """Claim run `--run-id`, run it, and record its end. Exit code 0: finished, stopped or nothing to do."""
    parser = argparse.ArgumentParser(prog="python -m app.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the studio database file")
    parser.add_argument("--run-id", type=int, required=True, help="the queued run to execute")
    parser.add_argument("--data-dir", required=True, help="where run outputs go (<data-dir>/runs/run-<id>)")
    options = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = Store(options.db)
    run_id = options.run_id
    stop_event = threading.Event()
    # Only set a flag here: the handler runs between two bytecodes of the main thread, maybe mid-transaction.
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())

    if not store.claim_run(run_id, os.getpid()):
        run = store.get_run(run_id)
        state = "does not exist" if run is None else f"is {run['status']}, not queued"
        print(f"Run {run_id} {state} in {options.db}; nothing to do (queue it again to run it).", flush=True)
        return 0

    from app.recorder import StoreLogHandler

    log_handler = StoreLogHandler(store, run_id)
    logging.getLogger().addHandler(log_handler)
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
        else:
            error = traceback.format_exc()
            logger.error("Run %s failed:\n%s", run_id, error)
    finally:
        heartbeat.stop()
        fields: dict[str, Any] = {"status": status, "finished_at": time.time(), "error": error}
        if status == "finished":
            fields.update(progress=1.0, stage=None)
        # Only a run this worker still owns: a run deleted meanwhile stays deleted.
        store.transition(run_id, ("running", "stopping"), **fields)
        logger.info("Run %s %s.", run_id, status)
        log_handler.flush()
        logging.getLogger().removeHandler(log_handler)
    return 1 if status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
