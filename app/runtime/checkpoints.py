"""A run's checkpoints on disk: which one a resume starts from, where a resumed trainer stands, which weights the
playground loads, and when they go (docs/runtime.md, "The worker"). What makes a checkpoint complete is the
library's (`a2po.checkpoints`).

The scheduler's process imports this module (through the worker's), so what needs transformers or the trainer's
callbacks is imported inside the functions that work on a trainer: that process never imports torch.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

from a2po.checkpoints import (
    STATE_FILE,
    checkpoint_folders,
    checkpoint_state,
    checkpoint_step,
    has_weights,
    named_step,
    newest_complete,
)
from app.runtime.data_folder import DataFolder
from storage import Store

logger = logging.getLogger("app.runtime.worker")


def remove_checkpoints(store: Store, run_id: int) -> None:
    """The final model replaces a finished run's checkpoints (optimizer states are twice the model): free the disk.
    Only once its end is recorded, so a kill before that still resumes from them."""
    for row in store.list_checkpoints(run_id):
        shutil.rmtree(row["path"], ignore_errors=True)
        store.remove_checkpoint(run_id, row["path"])


def resume_checkpoint(store: Store, run_id: int, output_dir: Path) -> str | None:
    """The newest complete checkpoint of the run, or None (train from the start).

    Checkpoint folders after it (cut short by a kill mid-save, or never recorded because the kill came between
    the save and the database write) are removed first: the Trainer's rotation keeps the highest step numbers,
    so a torn newer folder would otherwise survive while a complete older one is deleted.
    """
    recorded = {Path(row["path"]).name for row in store.list_checkpoints(run_id)}
    folders = checkpoint_folders(output_dir)
    chosen = newest_complete(folders)
    for folder in folders:
        if chosen is None or named_step(folder) > named_step(chosen):
            logger.warning("Run %s: removing incomplete checkpoint %s.", run_id, folder)
            shutil.rmtree(folder, ignore_errors=True)
            store.remove_checkpoint(run_id, str(folder))
    if chosen is not None and chosen.name not in recorded:
        # Saved, but the worker died before recording it.
        store.add_checkpoint(run_id, checkpoint_step(chosen), str(chosen))
    return None if chosen is None else str(chosen)


def trained_weights(store: Any, run: dict[str, Any], data_dir: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """The folder with a run's trained weights and how to call it: the final model ("final model") when the run
    saved one, else its newest complete checkpoint ("checkpoint step N"); None when it has none yet. Nothing is
    removed: the run may still be writing a newer one."""
    out = Path(run["output_dir"]) if run.get("output_dir") else DataFolder(data_dir).run_output(run["id"])
    has_config = (out / "config.json").is_file() or (out / "adapter_config.json").is_file()
    if has_config and has_weights(out):
        return out, "final model"
    recorded = [Path(row["path"]) for row in store.list_checkpoints(run["id"])]
    chosen = newest_complete([*checkpoint_folders(out), *recorded])
    return None if chosen is None else (chosen, f"checkpoint step {checkpoint_step(chosen)}")


# ------------------------------------------------------------------------------------------- a trainer resumed

def trained_to_the_end(trainer: Any, checkpoint: str) -> bool:
    """Whether the checkpoint holds the run's last step (`max_steps`), or a step where the run had spent its budget
    of time or compute (`max_train_seconds`, `max_train_flops`, or its share of one: counted on the counters the
    checkpoint keeps): a chunk that stopped there, its final evaluation left for the next chunk, ended the run's
    training, not just the chunk."""
    if trainer.args.max_steps > 0 and checkpoint_step(checkpoint) >= trainer.args.max_steps:
        return True
    state = checkpoint_state(checkpoint)
    return trainer.run_counters.restored(state.get("stateful_callbacks") or {}).budget_reached(trainer.args)


def restore_final(trainer: Any, checkpoint: str) -> None:
    """The weights (or adapter) and the trainer state of a checkpoint of the last step (`trained_to_the_end`),
    without training: the Trainer, resumed there, would train one step past `max_steps` (in the middle of an epoch)
    or past the time budget."""
    from transformers.trainer_callback import TrainerState

    trainer._load_from_checkpoint(checkpoint)
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / STATE_FILE))
    trainer.run_counters.load(trainer.state)  # the final evaluation is logged on the run's clock


def evaluation_pending(trainer: Any, checkpoint: str, evaluated: set[int]) -> bool:
    """Whether the checkpoint's step was due for an evaluation that is not among the `evaluated` steps: one its
    clock says was asked for and never ran (whatever asked: `eval_steps`, `eval_every_seconds`), or, for a
    checkpoint of before that record, one every `eval_steps`. (The evaluation after the last step is the job's own,
    after training.)"""
    from a2po.callbacks import RunCounters

    if trainer.eval_dataset is None:
        return False
    state = checkpoint_state(checkpoint)
    step = int(state["global_step"])
    counters = RunCounters.saved(state.get("stateful_callbacks") or {})
    if "evaluation_due" in counters:
        return counters["evaluation_due"] == step and step not in evaluated
    if str(trainer.args.eval_strategy) not in ("steps", "IntervalStrategy.STEPS"):
        return False
    # The checkpoint's state holds the run's own step counts: an epoch-based run has no max_steps in its
    # arguments, and an `eval_steps` fraction of the run is resolved there, as the Trainer resolved it.
    planned = int(state.get("max_steps") or trainer.args.max_steps)
    every = float(state.get("eval_steps") or trainer.args.eval_steps or 0)
    if 0 < every < 1 and planned > 0:
        every = math.ceil(planned * every)
    last = planned > 0 and step >= planned
    return every >= 1 and step % int(every) == 0 and not last and step not in evaluated
