"""`StoreRecorder`: the observer that writes what an A*-PO run does into the studio database.

It is the only link between training and the dashboard: the trainer calls it (`a2po.callbacks.A2POCallback`), it
writes through `storage.writes.RunWriter` (the store, or a chunk's journal), and it reads back one thing, whether the
user asked the run to stop.

Write volume stays small: three transactions per stage-1 batch (the shared reference samples, the run's own V*
rows, the stage's cost so far), one per split at the end of stage 1 (the split's whole table as the run trains with
it), one per `on_log`, per sample batch, per evaluation and per checkpoint; progress and heartbeat share one row
update at most every `progress_interval` seconds. A kill between the writes of a batch loses nothing: the run's rows
are written again from the shared ones when it resumes (`app.runtime.worker`) and at the end of its stage 1.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from a2po.callbacks import A2POCallback
from storage import lifecycle
from storage.writes import WorkerStore

# Loggers whose INFO lines go into the run's log; everything else only from WARNING up.
VERBOSE_LOGGERS = ("a2po", "app")
RUN_VALUE_KEYS = ("prompt_id", "v_star", "num_correct", "filtered")  # what `RunWriter.set_run_values` reads


class StoreRecorder(A2POCallback):
    """Record a run into `store` as it happens, and stop training when the run's status becomes "stopping".

    Args:
        store: the database (`storage.Store`), or a chunk's journal (`app.runtime.journal.ChunkLedger`).
        run_id: the run whose rows are written (metrics, samples, evaluations, checkpoints, progress).
        value_set_id: where stage-1 values go (shared between runs with the same V* settings); None skips them.
            The reference samples go there once; the V* and the filter this run trains with (its beta1 and
            `filter_all_incorrect`, which the shared set does not depend on) go to the run's own rows.
        stop_event: an in-process stop request (e.g. set by the worker's SIGTERM handler), checked with the status.
        progress_interval: least seconds between two progress/heartbeat writes (stage changes always write).
        stop_poll_interval: least seconds between two reads of the run's status.
        deadline: a `time.monotonic()` time by which the run should stop (a chunk's budget, `app.runtime.chunks`), or
            None. It stops as a stop request does, at the last batch or step that still ends before it (judged
            from the duration of the previous one); `deadline_reached` then tells it apart from a user's stop.
            An evaluation due at a step that would not end in time is not run: the run stops there with a
            checkpoint (`deferred_evaluation`), and the next chunk evaluates first.
    """

    def __init__(self, store: WorkerStore, run_id: int, value_set_id: int | None = None, *,
                 stop_event: threading.Event | None = None, progress_interval: float = 1.0,
                 stop_poll_interval: float = 0.5, deadline: float | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.value_set_id = value_set_id
        self.stop_event = stop_event or threading.Event()
        self.progress_interval = progress_interval
        self.stop_poll_interval = stop_poll_interval
        self.stage: str | None = None
        self.stopped = False  # True once this recorder told the trainer to stop
        self._stage_before_values: str | None = None
        self._last_progress_write = 0.0
        self._last_stop_poll = 0.0
        self.deadline = deadline
        self.deadline_reached = False
        self._unit_started: float | None = None  # when the current stage-1 batch or training step began
        self._unit_seconds = 0.0  # how long the last one took
        self._made_progress = False  # whether this process has recorded real progress yet
        self._eval_seconds: float | None = None  # how long this process's last evaluation took
        self.final_evaluation = False  # the caller evaluates after the last step (`app.runtime.worker.run_job`)
        self.deferred_evaluation = False  # an evaluation due now was left for the next chunk

    # ------------------------------------------------------------------ helpers

    def set_stage(self, stage: str | None, progress: float = 0.0) -> None:
        """Enter a stage ("values", "train", "eval"); always written at once."""
        self.stage = stage
        self._write_progress(progress, force=True)

    def _write_progress(self, progress: float, force: bool = False, real: bool = False) -> None:
        """Progress of the current stage, and the time of this progress (`progress_at`, which the scheduler's
        watchdog reads: unlike the heartbeat, it stops moving when the main thread is stuck). `real`: a stage-1
        batch, a training step, an evaluation or a checkpoint, which also ends a series of automatic restarts
        (`storage.lifecycle`, auto_resumes); the first one of this process is written at once."""
        now = time.monotonic()
        if real and not self._made_progress:
            force = True
        if force or now - self._last_progress_write >= self.progress_interval:
            self._last_progress_write = now
            fields = {"stage": self.stage, "progress": max(0.0, min(1.0, float(progress)))}
            if real:
                self._made_progress = True
                self.store.record_progress(self.run_id, **fields)
            else:
                self.store.heartbeat(self.run_id, progress_at=time.time(), **fields)

    def touch(self, real: bool = False) -> None:
        """Record progress without a stage change (e.g. the model is loaded; `real`: see `_write_progress`)."""
        if real:
            self._made_progress = True
            self.store.record_progress(self.run_id)
        else:
            self.store.heartbeat(self.run_id, progress_at=time.time())

    def stop_requested(self) -> bool:
        """True when the worker got a stop signal or the run's status says "stopping" (read at most every
        `stop_poll_interval` seconds, so calling this on every event is cheap)."""
        if self.stop_event.is_set():
            return True
        now = time.monotonic()
        if now - self._last_stop_poll >= self.stop_poll_interval:
            self._last_stop_poll = now
            run = self.store.get_run(self.run_id)
            if run is None or run["status"] == lifecycle.STOPPING:  # a deleted run must stop too
                self.stop_event.set()
        return self.stop_event.is_set()

    def _deadline_near(self) -> bool:
        """True when the next batch or step would end past the deadline (the previous one's duration as the
        guess); measures that duration as a side effect, so call it once per batch or step."""
        now = time.monotonic()
        if self._unit_started is not None:
            self._unit_seconds = now - self._unit_started
        self._unit_started = now
        if self.deadline is not None and now + self._unit_seconds >= self.deadline:
            self.deadline_reached = True
        return self.deadline_reached

    def _maybe_stop(self, control, save: bool) -> None:
        if self._deadline_near() | self.stop_requested():
            self.stopped = True
            control.should_training_stop = True
            if save:
                # Let the Trainer write a full checkpoint (weights, optimizer, scheduler, RNG, state) for resuming,
                # and log the last partial window of metrics instead of dropping it.
                control.should_save = True
                control.should_log = True

    # ------------------------------------------------------------------ stage 1

    def on_values_begin(self, args, state, control, *, split: str, num_prompts: int, num_pending: int, **kwargs):
        self._stage_before_values = self.stage if self.stage != "values" else self._stage_before_values
        self.stage = "values"
        self._unit_started = time.monotonic()
        done = num_prompts - num_pending
        self._write_progress(done / num_prompts if num_prompts else 1.0, force=True)
        self.store.add_log(self.run_id, f"Stage 1 ({split}): {num_pending} of {num_prompts} prompts to sample "
                                        f"({done} already have V*).")

    def on_values_batch(self, args, state, control, *, split: str, records: list[dict[str, Any]], done: int,
                        total: int, seconds: float | None = None, completion_tokens: int | None = None,
                        batch_seconds: float = 0.0, batch_tokens: int = 0, flops: float | None = None,
                        batch_flops: float = 0.0, **kwargs):
        if self.value_set_id is not None:
            # The batch's cost goes with the shared rows: a run that reuses them is charged it (equal time and
            # compute).
            self.store.add_values(self.value_set_id, split, records, seconds=batch_seconds, tokens=batch_tokens,
                                  flops=batch_flops)
            self.store.set_run_values(self.run_id, split, run_value_rows(records))
        if seconds is not None and records:
            # The split's stage-1 cost so far, after each batch: a stop or kill in stage 1 keeps what was spent,
            # and the next start continues from it (`app.runtime.worker`).
            self.store.add_metrics(self.run_id, 0, {f"values/{split}/runtime": seconds,
                                                    f"values/{split}/completion_tokens": completion_tokens or 0,
                                                    f"values/{split}/flops": flops or 0.0})
        self._write_progress(done / total if total else 1.0, real=True)
        self._maybe_stop(control, save=False)

    def on_values_end(self, args, state, control, *, split: str, values, summary: dict[str, float], **kwargs):
        # The split's whole table as the run trains with it: rows reused from the shared set, rescored with this
        # run's beta1, and its own. The value set's summary is written by `app.runtime.worker` once every split is done.
        if self.value_set_id is not None and values is not None:
            self.store.set_run_values(self.run_id, split, run_value_rows(values), replace=True)
        self.stage = self._stage_before_values
        self._write_progress(1.0 if self.stage is None else 0.0, force=True)
        self.store.add_log(self.run_id, f"Stage 1 ({split}) done: " + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))

    # ------------------------------------------------------------------ stage 2

    def on_train_begin(self, args, state, control, **kwargs):
        self._unit_started = time.monotonic()  # the first step's duration is measured from here
        self.set_stage("train", state.global_step / state.max_steps if state.max_steps else 0.0)

    def on_step_end(self, args, state, control, **kwargs):
        self._write_progress(state.global_step / state.max_steps if state.max_steps else 0.0, real=True)
        last = bool(state.max_steps and state.global_step >= state.max_steps)
        evaluation_due = control.should_evaluate or (last and self.final_evaluation)
        if self.deadline is not None and evaluation_due and not self._evaluation_fits():
            # Left for the next chunk, which starts with it: an evaluation cut off at the deadline would lose the
            # steps since the last checkpoint (the Trainer evaluates before it saves).
            self.deferred_evaluation = self.deadline_reached = self.stopped = True
            control.should_evaluate = False
            control.should_save = control.should_log = True
            # After the last step training ends by itself: a stop asked there makes a resume train one step more.
            control.should_training_stop = control.should_training_stop or not last
            self.store.add_log(self.run_id, f"The evaluation of step {state.global_step} is left for the next "
                                            "chunk: it would not end before this chunk's deadline.")
            return
        if last:
            return  # the last step: training ends here anyway (stopped here, a resume would train one step more)
        self._maybe_stop(control, save=True)

    def _evaluation_fits(self) -> bool:
        """Whether an evaluation started now ends before the deadline, judged from the last one this process ran
        (none yet: it does not, and the next chunk starts with it)."""
        return self._eval_seconds is not None and time.monotonic() + self._eval_seconds < self.deadline

    def on_train_end(self, args, state, control, **kwargs):
        self._write_progress(state.global_step / state.max_steps if state.max_steps else 1.0, force=True)

    def on_log(self, args, state, control, logs: dict[str, Any] | None = None, **kwargs):
        if logs:
            self.store.add_metrics(self.run_id, state.global_step, logs)

    def on_samples(self, args, state, control, *, samples: list[dict[str, Any]], **kwargs):
        # Tables show what the user asked, not the chat template around it (the V* detail keeps the template).
        self.store.add_samples(self.run_id, [{**x, "prompt_text": x.get("question") or x.get("prompt_text")}
                                             for x in samples])

    def on_evaluate(self, args, state, control, metrics: dict[str, Any] | None = None, **kwargs):
        if metrics:
            self.store.add_evaluation(self.run_id, state.global_step, metrics)
            self.touch(real=True)
            runtimes = [float(v) for k, v in metrics.items() if k.endswith("_runtime") and isinstance(v, (int, float))]
            if runtimes:
                self._eval_seconds = max(runtimes)

    def on_save(self, args, state, control, **kwargs):
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(path):
            self.store.add_checkpoint(self.run_id, state.global_step, path)
            self.store.add_log(self.run_id, f"Checkpoint saved: {path}")
            # The Trainer's rotation may have removed older folders: keep the table in step with the disk.
            for row in self.store.list_checkpoints(self.run_id):
                if not os.path.isdir(row["path"]):
                    self.store.remove_checkpoint(self.run_id, row["path"])
            self.touch(real=True)


def run_value_rows(records: Any) -> list[dict[str, Any]]:
    """What a run's own V* rows keep of stage-1 records (a list of dicts or a `datasets.Dataset` table)."""
    if hasattr(records, "select_columns"):  # a Dataset: its narrow columns only, not the completions
        if not len(records):
            return []
        records = records.select_columns([c for c in RUN_VALUE_KEYS if c in records.column_names]).to_list()
    return [{k: r.get(k) for k in RUN_VALUE_KEYS} for r in records]


class StoreLogHandler(logging.Handler):
    """A logging handler that appends records to a run's log lines in the store.

    Lines are buffered and written in one transaction every `flush_interval` seconds (or on WARNING and above, or
    a record logged with `extra={"flush_now": True}`: a line that must survive a kill right after it), so chatty
    libraries cost few writes. Call `flush()` before the process exits.
    """

    def __init__(self, store: WorkerStore, run_id: int, flush_interval: float = 1.0) -> None:
        super().__init__(level=logging.INFO)
        self.store = store
        self.run_id = run_id
        self.flush_interval = flush_interval
        self._buffer: list[tuple[str, str]] = []
        self._last_flush = time.monotonic()
        self._writing = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        verbose = record.name.split(".")[0] in VERBOSE_LOGGERS
        return record.levelno >= (logging.INFO if verbose else logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._writing, "active", False):
            return  # a record logged while this handler writes (e.g. by the database layer) would recurse
        try:
            message = self.format(record)
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)
            return
        with self.lock:
            self._buffer.append((record.levelname, message))
        if (record.levelno >= logging.WARNING or getattr(record, "flush_now", False)
                or time.monotonic() - self._last_flush >= self.flush_interval):
            self.flush()

    def flush(self) -> None:
        with self.lock:
            lines, self._buffer = self._buffer, []
        if not lines:
            return
        self._last_flush = time.monotonic()
        self._writing.active = True
        try:
            self.store.add_logs(self.run_id, lines)
        except Exception as error:  # noqa: BLE001 - a full disk must not turn into a crashed training run
            print(f"Could not write {len(lines)} log lines to {self.store.path}: {error}", flush=True)
        finally:
            self._writing.active = False
