"""A checkpoint folder as the Trainer writes it: complete or cut short, its step, and the newest complete one of a run's
output folder. The CLI's `--resume_from_checkpoint true`, the studio's resumes and its playground all search here
(docs/runtime.md, "The worker")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The files holding a model's weights: a complete checkpoint, and a final model, has one of them.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
# The Trainer writes it last, so a folder without a readable one was cut short (a kill or a full disk mid-save).
STATE_FILE = "trainer_state.json"


def has_weights(folder: str | os.PathLike[str]) -> bool:
    """Whether `folder` holds a model's weights (or a LoRA adapter's)."""
    return any((Path(folder) / name).is_file() for name in WEIGHT_FILES)


def checkpoint_state(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The Trainer's state saved with a checkpoint (its step, log history and callbacks' state)."""
    return json.loads((Path(folder) / STATE_FILE).read_text())


def checkpoint_step(folder: str | os.PathLike[str]) -> int:
    """The training step a checkpoint was saved at."""
    return int(checkpoint_state(folder)["global_step"])


def checkpoint_complete(folder: str | os.PathLike[str]) -> bool:
    """True when a checkpoint folder holds everything a resume needs: a readable state and the weights."""
    try:
        state = checkpoint_state(folder)
    except (OSError, ValueError):
        return False
    return "global_step" in state and has_weights(folder)


def named_step(folder: Path) -> int:
    """The step a `checkpoint-<step>` folder's name says; -1 for another name."""
    tail = folder.name.split("-")[-1]
    return int(tail) if tail.isdigit() else -1


def checkpoint_folders(output_dir: str | os.PathLike[str]) -> list[Path]:
    """The `checkpoint-<step>` folders of a run's output folder, complete or not, newest first."""
    return sorted((p for p in Path(output_dir).glob("checkpoint-*") if named_step(p) >= 0), key=named_step,
                  reverse=True)


def newest_complete(folders: Iterable[Path]) -> Path | None:
    """The complete checkpoint of the highest step among `folders`, or None."""
    return next((p for p in sorted(set(folders), key=named_step, reverse=True) if checkpoint_complete(p)), None)
