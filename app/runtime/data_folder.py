"""The data folder's layout, spelled once: run outputs, worker logs, journals, exports, the workers' empty working
directory and the folder's mark (docs/runtime.md)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from app.runtime import journal

LOG_TAIL_LINES = 20
# A worker started away from the studio's machine (a Ray job) checks that the data folder it was given is the
# studio's: the file `MARK` there holds the token the studio put in this variable.
TOKEN_ENV = "A2PO_DATA_FOLDER_CHECK"  # not named like a credential: those are dropped
MARK = ".a2po-data-folder"


def tail(path: str | os.PathLike[str], lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a text file ("" if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class DataFolder:
    """Where the studio keeps a run's files, and nothing else decides those paths."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.runs = self.root / "runs"
        self.logs = self.root / "logs"
        self.exports = self.root / "exports"
        self.cache = self.root / "cache"  # Gradio's uploads, model downloads, the workers' working directory
        self.journals = journal.journal_dir(self.root)

    def run_output(self, run_id: int) -> Path:
        """Where a run's checkpoints and final model go."""
        return self.runs / f"run-{run_id}"

    def run_log(self, run_id: int) -> Path:
        """The worker's stdout/stderr file (tracebacks of crashes that never reached the database end up here)."""
        return self.logs / f"run-{run_id}.log"

    def log_tail(self, run_id: int, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.run_log(run_id), lines)

    @property
    def worker_cwd(self) -> Path:
        """The empty working directory of every process that runs user-chosen names (workers, chunks, the
        playground, the studio itself): a hub id such as "org/name" never names a local folder by accident."""
        return self.cache / "worker-cwd"

    def make_worker_cwd(self) -> Path:
        self.worker_cwd.mkdir(parents=True, exist_ok=True)
        return self.worker_cwd

    def token(self) -> str:
        """The token of the folder's mark, which a worker on a node reads to prove it sees this folder
        (`folder_problem`); made once per folder."""
        mark = self.root / MARK
        try:
            token = mark.read_text().strip()
        except OSError:
            token = ""
        if not token:
            token = uuid.uuid4().hex
            mark.write_text(token + "\n")
        return token

    def clear_journal(self, run_id: int) -> None:
        journal.clear(self.root, run_id)

    def remove_run(self, run_id: int, output_dir: str | None, keep_journal: bool = False) -> None:
        """A deleted run's output directory (only under `runs/`: never a folder a spec or a user pointed
        elsewhere), log, journal (unless a page still follows its chunk) and exports."""
        runs = self.runs.resolve()
        for path in {self.run_output(run_id), *([Path(output_dir)] if output_dir else [])}:
            if path.is_dir() and path.resolve() != runs and path.resolve().is_relative_to(runs):
                shutil.rmtree(path, ignore_errors=True)
        self.run_log(run_id).unlink(missing_ok=True)
        if not keep_journal:
            journal.clear(self.root, run_id)
        for export in self.exports.glob(f"run-{run_id}-*"):
            shutil.rmtree(export, ignore_errors=True) if export.is_dir() else export.unlink(missing_ok=True)

    def remove_orphans(self, known: set[int]) -> None:
        """Outputs, logs, journals and exports of runs that no longer exist (deleted while files were busy, or by
        an older studio that left them behind): a run's files go with it."""
        patterns = [(self.runs, re.compile(r"run-(\d+)")), (self.logs, re.compile(r"run-(\d+)\.log")),
                    (self.journals, re.compile(r"run-(\d+)\..*")), (self.exports, re.compile(r"run-(\d+)-.*"))]
        for folder, pattern in patterns:
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                match = pattern.fullmatch(path.name)
                if match and int(match.group(1)) not in known:
                    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def folder_problem(run: dict[str, Any], data_dir: str) -> str | None:
    """Why this process cannot work on the run's files (it runs on a node that does not mount the studio's data
    folder at the same path), or None. Only checked when the studio asks (`TOKEN_ENV`)."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return None
    mark = Path(data_dir) / MARK
    try:
        found = mark.read_text().strip()
    except OSError as error:
        found, reason = None, f"{mark} cannot be read ({error.strerror or error})"
    else:
        reason = f"{mark} belongs to another studio"
    where = f"host {socket.gethostname()}"
    if found != token:
        return (f"The worker (on {where}) cannot see the studio's data folder {data_dir}: {reason}. Every node of "
                "the cluster must mount the data folder at the same path (docs/cluster.md).")
    output = run.get("output_dir")
    if output and not Path(output).is_dir():
        return (f"The worker (on {where}) cannot see the run's folder {output}, though it sees the data folder "
                f"{data_dir}: mount the whole data folder at the same path on every node (docs/cluster.md).")
    return None
