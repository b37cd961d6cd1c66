"""A run's checkpoints on disk: which one a resume starts from, and when they go (docs/runtime.md)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from storage import Store

logger = logging.getLogger("app.runtime.worker")


def remove_checkpoints(store: Store, run_id: int) -> None:
    """The final model replaces a finished run's checkpoints (optimizer states are twice the model): free the disk.
    Only once its end is recorded, so a kill before that still resumes from them."""
    for row in store.list_checkpoints(run_id):
        shutil.rmtree(row["path"], ignore_errors=True)
        store.remove_checkpoint(run_id, row["path"])



def checkpoint_complete(path: str | os.PathLike[str]) -> bool:
    """True when a checkpoint folder holds everything a resume needs. The Trainer writes `trainer_state.json`
    last, so a folder without a readable one was cut short (a kill or a full disk mid-save)."""
    path = Path(path)
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    weights = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
    return "global_step" in state and any((path / name).is_file() for name in weights)



def resume_checkpoint(store: Store, run_id: int, output_dir: Path) -> str | None:
    """The newest complete checkpoint of the run, or None (train from the start).

    Checkpoint folders after it (cut short by a kill mid-save, or never recorded because the kill came between
    the save and the database write) are removed first: the Trainer's rotation keeps the highest step numbers,
    so a torn newer folder would otherwise survive while a complete older one is deleted.
    """
    recorded = {Path(row["path"]).name for row in store.list_checkpoints(run_id)}
    folders = sorted((p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()),
                     key=lambda p: int(p.name.split("-")[-1]), reverse=True)
    chosen = next((p for p in folders if checkpoint_complete(p)), None)
    for folder in folders:
        if chosen is None or int(folder.name.split("-")[-1]) > int(chosen.name.split("-")[-1]):
            logger.warning("Run %s: removing incomplete checkpoint %s.", run_id, folder)
            shutil.rmtree(folder, ignore_errors=True)
            store.remove_checkpoint(run_id, str(folder))
    if chosen is not None and chosen.name not in recorded:
        step = json.loads((chosen / "trainer_state.json").read_text())["global_step"]
        store.add_checkpoint(run_id, step, str(chosen))  # saved, but the worker died before recording it
    return None if chosen is None else str(chosen)


