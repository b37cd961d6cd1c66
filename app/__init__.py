"""A*-PO Studio: a Gradio dashboard that launches, watches and compares A*-PO runs (`python -m app`).

This package stays light on import: worker processes import `app.runtime.recorder` and `app.runtime.worker`, which
must not pull in Gradio. The user interface lives in `app.web`, the command line in `app.__main__`.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "A2PO_STUDIO_DATA"


def default_data_dir() -> Path:
    """`$A2PO_STUDIO_DATA` if set, else `$XDG_DATA_HOME/a2po-studio` (default `~/.local/share/a2po-studio`)."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "a2po-studio"
