"""The lock a studio holds for its lifetime on the database it serves: one studio per database.

- `FileLock`, for a SQLite file: an exclusive `flock` on `scheduler.lock` in the database's folder, holding who
  took it. The kernel drops it when the process dies, however it dies; child processes never inherit it.
- `AdvisoryLock`, for a PostgreSQL database: a session-level advisory lock on a connection of its own, which goes
  with that connection, so a studio that dies (even by SIGKILL) never leaves it behind.

Both raise `error` with a message naming who holds the lock and `hint` (what to do instead). `check()` says whether
the lock is still held: an advisory lock is lost with its connection when the server restarts (and another studio may
take it then), so its holder checks before acting on it and takes it again with `acquire()`.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from storage.dialects import advisory_key

LOCK_FILE = "scheduler.lock"


class StudioLock(ABC):
    """What both locks share: `acquire(**owner)` takes the lock (again: nothing), `held`, `release()`; a refusal
    raises `error` with `hint`. A subclass says how to take the lock (`_take`, returning what holds it) and how to
    give it back (`_give_back`)."""

    def __init__(self, error: type[Exception], hint: str) -> None:
        self.error = error
        self.hint = hint
        self._holding: Any = None

    @property
    def held(self) -> bool:
        return self._holding is not None

    def acquire(self, **owner: Any) -> None:
        if self._holding is None:
            self._holding = self._take(owner)

    def release(self) -> None:
        if self._holding is not None:
            holding, self._holding = self._holding, None
            self._give_back(holding)

    def check(self) -> bool:
        """Whether the lock is still held. One found lost is let go of, so that `acquire()` can take it again."""
        if self._holding is not None and not self._still_held(self._holding):
            self.release()
        return self.held

    def _still_held(self, holding: Any) -> bool:
        return True  # a `flock` lasts as long as its process

    @abstractmethod
    def _take(self, owner: dict[str, Any]) -> Any: ...

    @abstractmethod
    def _give_back(self, holding: Any) -> None: ...


class FileLock(StudioLock):
    """An exclusive `flock` on `<folder>/scheduler.lock` (the SQLite database's folder), holding who took it."""

    def __init__(self, folder: Path, error: type[Exception] = RuntimeError,
                 hint: str = "Stop it first, or start this one with another --data-dir (or --db-dir).") -> None:
        super().__init__(error, hint)
        self.path = Path(folder) / LOCK_FILE

    def _take(self, owner: dict[str, Any]) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            raise self.error(f"Another A*-PO Studio is already serving {self.path.parent} ({holder}). "
                             f"{self.hint}") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), **owner}).encode())
        return fd

    def _give_back(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class AdvisoryLock(StudioLock):
    """A PostgreSQL session-level advisory lock named `name` on the database at `url`, on a connection of its own
    that stays open while the lock is held (the scheduler's "one studio per database", as `flock` is for a file).

    `acquire(**owner)` raises `error` (a message naming who holds it) when another process has it; who holds it is
    read from the holder's connection (`application_name`: the studio's host, pid and `owner`), since the lock
    itself carries nothing.
    """

    def __init__(self, url: Any, name: str = "scheduler", error: type[Exception] = RuntimeError,
                 hint: str = "Stop it first, or start this one with another --db.") -> None:
        super().__init__(error, hint)
        self.url = url
        self.name = name
        self.key = advisory_key(name)

    def _take(self, owner: dict[str, Any]) -> tuple[Engine, Connection]:
        label = " ".join(["a2po-studio", socket.gethostname(), f"pid {os.getpid()}", *map(str, owner.values())])
        name = label.encode()[:63].decode(errors="ignore")  # NAMEDATALEN: PostgreSQL keeps 63 bytes of it
        # Keepalives: a server that vanished without closing the connection (a network cut) is noticed by `check()`
        # in seconds rather than the kernel's hours.
        engine = create_engine(self.url, poolclass=NullPool, connect_args={
            "application_name": name, "connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10,
            "keepalives_interval": 5, "keepalives_count": 3})
        connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            if connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}).scalar():
                return engine, connection
            holder = connection.execute(text(
                "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND l.classid = :high AND l.objid = :low"),
                {"high": (self.key >> 32) & 0xFFFFFFFF, "low": self.key & 0xFFFFFFFF}).first()
        except BaseException:
            connection.close()
            engine.dispose()
            raise
        connection.close()
        engine.dispose()
        who = "unknown process" if holder is None else (
            f"{holder[0] or 'a connection'} from {holder[1] or 'a local socket'}, since {holder[2]:%Y-%m-%d %H:%M:%S}")
        database = self.url.render_as_string(hide_password=True) if hasattr(self.url, "render_as_string") \
            else str(self.url)
        raise self.error(f"Another A*-PO Studio is already serving the database {database} ({who}). {self.hint}")

    def _still_held(self, holding: tuple[Engine, Connection]) -> bool:
        try:
            return bool(holding[1].execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() "
                "AND classid = :high AND objid = :low"),
                {"high": (self.key >> 32) & 0xFFFFFFFF, "low": self.key & 0xFFFFFFFF}).scalar())
        except Exception:  # noqa: BLE001 - a connection that fails (the server restarted) took the lock with it
            return False

    def _give_back(self, holding: tuple[Engine, Connection]) -> None:
        engine, connection = holding
        try:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
        except Exception:  # noqa: BLE001 - a connection already gone has released the lock with it
            pass
        finally:
            connection.close()
            engine.dispose()
