"""Presets a studio's users saved (the Studies page's "Save the best point as a preset"): run specs kept as JSON in
`<data-dir>/presets/<name>.json`, listed after the built-in presets on the Launch page and loaded into the form
through the same allow-list as a cloned run. Everyone who opens the studio sees them, so on a studio with logins
only an admin saves one; a studio without logins (one person on their machine, a class's server without accounts)
lets anyone save."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

NAME = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")
PREFIX = "saved:"  # the Launch page's dropdown value of a saved preset, beside the built-in names
KEEP = ("name", "action", "method", "model", "dataset", "rewards", "config", "peft", "num_processes", "fsdp", "runner")


class PresetError(ValueError):
    """A preset that cannot be saved or read; the message names the problem and the fix."""


def folder(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "presets"


def saved(data_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The saved presets by name, oldest first (an unreadable file is left out)."""
    found = []
    for path in folder(data_dir).glob("*.json"):
        try:
            found.append((path.stat().st_mtime, path.stem, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return {name: spec for _, name, spec in sorted(found, key=lambda f: f[:2])}


def save(data_dir: str | os.PathLike[str], name: str, spec: dict[str, Any]) -> Path:
    """Keep `spec` (a run's, its study label and stage-1 seed left out) as preset `name`; an existing one of that
    name is replaced (written to a temporary file first, so a crash never leaves half a preset)."""
    name = (name or "").strip()
    if not NAME.match(name):
        raise PresetError(f"A preset's name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or a "
                          f"digit (got {name[:70]!r}).")
    kept = {k: v for k, v in spec.items() if k in KEEP}
    kept["config"] = {k: v for k, v in (kept.get("config") or {}).items() if k != "values_seed"}
    kept["name"] = name
    target = folder(data_dir) / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(kept, indent=2, sort_keys=True))
    os.replace(temporary, target)
    return target


def choices(data_dir: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The Launch page's dropdown entries of the saved presets: ("Saved: name", "saved:name")."""
    return [(f"Saved: {name}", PREFIX + name) for name in saved(data_dir)]
