"""Keep the live database on local disk and consistent copies of it in the data folder (`--db-snapshot-every`).

Why: the studio's SQLite database runs in WAL mode, which needs a shared-memory index (the `-shm` file, mapped by
every connection) and byte-range locks that only a local filesystem provides; SQLite's documentation says WAL does
not work over a network filesystem. A Space's persistent storage is a storage bucket mounted as a volume: object
storage behind a FUSE or NFS mount (hf-mount) that in its default mode accepts only sequential writes, uploads a
file on close, treats fsync as "flush later", and is eventually consistent. So on a Space the database lives on
the container's own (ephemeral) disk (`--db-dir`), and this module:

- on start, when that database file is missing (a fresh container), restores the newest snapshot that passes
  `PRAGMA quick_check`;
- every `every` seconds, and once more at shutdown, takes a consistent copy with SQLite's online backup API into a
  local temporary file, then copies that file sequentially into `<data-dir>/db-snapshots/` under a temporary name
  and renames it into place. A half-written snapshot (a crash, a full bucket) is never under a snapshot's name, so
  it never hides the previous good one; the newest `keep` snapshots are kept.

What a restart loses: the writes after the last snapshot (at most `every` seconds of them, none after a clean
SIGTERM). Run outputs and checkpoints are written straight into the data folder and are not affected.
No Gradio import here: `python -m app` uses it before the dashboard exists, and the tests use it alone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

SNAPSHOT_DIR = "db-snapshots"
KEEP = 3
# Filesystem types (as /proc/self/mountinfo names them) on which SQLite's WAL mode is unsafe.
NETWORK_FILESYSTEMS = re.compile(r"^(fuse(\..*)?|fuseblk|nfs4?|cifs|smb3?|9p|ceph|glusterfs|lustre|gpfs|afs)$")

logger = logging.getLogger("app.runtime.snapshot")


class SnapshotError(RuntimeError):
    """A snapshot could not be written or no snapshot could be restored (the message says which and what to do)."""


def filesystem_type(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding `path` ("ext4", "overlay", "fuse", ...) from the kernel's mount table,
    or None where that is unknown (no /proc, e.g. macOS)."""
    target, rest = Path(path).expanduser().absolute(), []
    while not target.exists() and target != target.parent:  # a folder not made yet is on its parent's mount
        target, rest = target.parent, [target.name, *rest]
    target_text = os.path.join(os.path.realpath(target), *rest)
    best, found = -1, None
    try:
        with open(mountinfo) as mounts:
            for line in mounts:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                inside = target_text == point or target_text.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best:
                    best, found = len(point), right.split()[0]
    except OSError:
        return None
    return found


def network_filesystem(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The filesystem type if `path` lies on a network or FUSE filesystem (where WAL is unsafe), else None."""
    kind = filesystem_type(path, mountinfo)
    return kind if kind and NETWORK_FILESYSTEMS.match(kind) else None


def check_database(path: str | os.PathLike[str]) -> str | None:
    """Why the SQLite file at `path` is unusable (`PRAGMA quick_check`), or None when it is sound."""
    try:
        connection = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True)
        try:
            result = connection.execute("PRAGMA quick_check").fetchall()
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        return str(error)
    return None if result == [("ok",)] else "; ".join(str(row[0]) for row in result[:5])


def _copy_file(source: Path, target: Path) -> None:
    """Copy sequentially (all a bucket mount in streaming mode accepts), then fsync."""
    with open(source, "rb") as read, open(target, "wb") as write:
        shutil.copyfileobj(read, write, 1 << 20)
        write.flush()
        os.fsync(write.fileno())


class DatabaseSnapshots:
    """Restore, take and prune snapshots of the database `db_path` in `<data_dir>/db-snapshots/` (see the module
    docstring). `every` seconds between two snapshots in the background thread; None or 0: off."""

    def __init__(self, db_path: str | os.PathLike[str], data_dir: str | os.PathLike[str],
                 every: float | None = None, keep: int = KEEP) -> None:
        self.db_path = Path(db_path).expanduser().absolute()
        self.folder = Path(data_dir).expanduser().absolute() / SNAPSHOT_DIR
        self.every = every if every and every > 0 else None
        self.keep = max(1, keep)
        self._pattern = re.compile(rf"^{re.escape(self.db_path.stem)}-(\d{{8}})-\d{{8}}T\d{{6}}Z\.db$")
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple | None = None  # the database files' (mtime, size) at the last snapshot
        self._running = False

    @property
    def enabled(self) -> bool:
        return self.every is not None

    def snapshots(self) -> list[Path]:
        """The complete snapshots, newest first (temporary files never match a snapshot's name)."""
        try:
            names = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := self._pattern.match(p.name))]
        except FileNotFoundError:
            return []
        return [path for _, path in sorted(names, reverse=True)]

    # ------------------------------------------------------------------ restore

    def restore(self) -> Path | None:
        """If the database file is missing, put the newest sound snapshot in its place and return that snapshot;
        None when the database exists or there is no snapshot. Raises `SnapshotError` when snapshots exist but none
        is readable (starting empty would hide them)."""
        if self.db_path.exists():
            return None
        candidates = self.snapshots()
        if not candidates:
            return None
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.db_path.with_name(f".{self.db_path.name}.restoring")
        problems = []
        for snapshot in candidates:
            _copy_file(snapshot, partial)
            problem = check_database(partial)
            if problem is None:
                for suffix in ("-wal", "-shm", "-journal"):  # a stale WAL would be replayed onto the restored file
                    Path(f"{self.db_path}{suffix}").unlink(missing_ok=True)
                os.replace(partial, self.db_path)
                return snapshot
            problems.append(f"{snapshot.name}: {problem}")
            logger.warning("Database snapshot %s is unreadable (%s); trying an older one.", snapshot, problem)
        partial.unlink(missing_ok=True)
        raise SnapshotError(f"No database snapshot in {self.folder} is readable ({'; '.join(problems)}). Move them "
                            f"elsewhere to start with an empty database, or copy a good studio database to "
                            f"{self.db_path}.")

    # ------------------------------------------------------------------ snapshots

    def _fingerprint(self) -> tuple:
        parts = []
        for path in (self.db_path, Path(f"{self.db_path}-wal")):
            try:
                stat = path.stat()
                parts.append((stat.st_mtime_ns, stat.st_size))
            except FileNotFoundError:
                parts.append(None)
        return tuple(parts)

    def _next_name(self) -> str:
        """`<stem>-<sequence>-<UTC time>.db`: the sequence orders snapshots even if the clock goes back."""
        newest = self.snapshots()
        sequence = int(self._pattern.match(newest[0].name).group(1)) + 1 if newest else 1
        return f"{self.db_path.stem}-{sequence:08d}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.db"

    def snapshot(self, force: bool = False) -> Path | None:
        """Write a snapshot now and return it; None when the database is missing or unchanged since the last one
        (unless `force`). Raises `SnapshotError` (or OSError) when it cannot; the previous snapshots stay."""
        with self._lock:
            fingerprint = self._fingerprint()
            if not self.db_path.exists() or (fingerprint == self._last and not force):
                return None
            local = self.db_path.with_name(f".{self.db_path.name}.snapshot")
            local.unlink(missing_ok=True)
            try:
                # The online backup API: one step copies every page as of one read transaction, while the
                # workers keep writing (in WAL mode a reader never blocks a writer).
                with closing(sqlite3.connect(self.db_path, timeout=30)) as source, \
                        closing(sqlite3.connect(local)) as target:
                    source.backup(target)
                    target.execute("PRAGMA journal_mode = DELETE")  # a self-contained file: no -wal or -shm needed
                problem = check_database(local)
                if problem is not None:
                    raise SnapshotError(f"The copy of {self.db_path} failed its check ({problem}); the previous "
                                        "snapshots are kept.")
                self.folder.mkdir(parents=True, exist_ok=True)
                final = self.folder / self._next_name()
                partial = self.folder / f".{final.name}.partial"
                _copy_file(local, partial)
                os.replace(partial, final)  # only a complete file ever carries a snapshot's name
            finally:
                local.unlink(missing_ok=True)
            self._last = fingerprint
            for old in self.snapshots()[self.keep:]:
                old.unlink(missing_ok=True)
            return final

    # ------------------------------------------------------------------ background thread

    def start(self) -> None:
        """Remove leftovers of an interrupted snapshot, then snapshot every `every` seconds (if enabled)."""
        if not self.enabled or (self._thread is not None and self._thread.is_alive()):
            return
        if self.folder.is_dir():
            for leftover in self.folder.glob(".*.partial"):
                leftover.unlink(missing_ok=True)
        self._halt.clear()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="a2po-db-snapshots", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._halt.wait(self.every):
            try:
                self.snapshot()
            except Exception:  # noqa: BLE001 - a full or unreachable bucket must not stop the studio; retried
                logger.exception("Database snapshot to %s failed; retrying in %.0f s", self.folder, self.every)

    def stop(self, final: bool = True) -> Path | None:
        """Stop the thread and (with `final`) take a last snapshot; returns it. Does nothing unless `start()` ran,
        so a second call (the SIGTERM handler, then the app's exit) is harmless."""
        if not self._running:
            return None
        self._running = False
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        if not final:
            return None
        try:
            return self.snapshot()
        except Exception:  # noqa: BLE001 - shutting down: say so, and let the shutdown finish
            logger.exception("The final database snapshot to %s failed; the newest earlier one remains.", self.folder)
            return None
