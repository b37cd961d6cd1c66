"""Processes of the studio, read from /proc: is a pid alive, is it this run's worker, which processes a launcher
started; and the environment every child process of the studio starts from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def with_project_path(base: Mapping[str, str]) -> dict[str, str]:
    """`base` for a child process of the studio (a worker, the playground): it imports `a2po`, `app` and `storage`
    from this checkout whatever its working directory, and writes its output unbuffered (the log follows it)."""
    env = dict(base, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    return env


def pid_alive(pid: int | None) -> bool:
    """True if process `pid` exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): trust kill(0)


def is_worker_of(pid: int, run_id: int) -> bool:
    """True unless /proc shows that `pid` is not `app.runtime.worker` for this run (a pid reused by another program)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return pid_alive(pid)
    return "app.runtime.worker" in argv and any(a == "--run-id" and b == str(run_id) for a, b in zip(argv, argv[1:]))


def works_in(pid: int, folder: Path) -> bool:
    """True unless /proc shows that `pid` works in another folder than `folder`: a worker of another studio (a copy
    of this database, a second data folder) may carry the same run id, and is not this studio's to signal."""
    if not os.path.isdir("/proc/self"):
        return True  # no /proc (macOS): nothing to tell them apart by
    try:
        return os.path.realpath(os.readlink(f"/proc/{pid}/cwd")) == os.path.realpath(folder)
    except OSError:
        return False  # gone, or another user's: not a worker of this studio either way


def launched_processes(pid: int) -> list[int]:
    """The processes of a multi-process run when `pid` is its launcher (`accelerate launch`, see
    `app.runtime.launchers.worker_command`): its children, each in a session of its own. [] for anything else, and
    where there is no /proc."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if "accelerate.commands.launch" not in f.read().decode(errors="replace").split("\0"):
                return []
        entries = os.listdir("/proc")
    except OSError:
        return []
    children = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: the parent
                    children.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return children
