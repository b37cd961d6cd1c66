"""What differs between the two databases the store runs on, SQLite (a file, the default) and PostgreSQL (a server).

The store's queries are written once, in SQLAlchemy, and use these pieces where the two disagree:

- `insert(session, table)`: the dialect's INSERT, whose `on_conflict_do_update` / `on_conflict_do_nothing` both
  dialects spell the same way (SQLite's and PostgreSQL's upserts have one syntax, but SQLAlchemy has a class each).
- `greatest(a, b)`: the larger of two values (SQLite's two-argument `max()`, PostgreSQL's `greatest()`).
- `truncate(x)`: a float cut to an integer towards zero (SQLite's CAST does that; PostgreSQL's CAST rounds).
- `serialize(session, name)`: make write transactions that need to see each other's effects take turns. On SQLite
  every write transaction already holds the one write lock (`BEGIN IMMEDIATE`); on PostgreSQL (READ COMMITTED)
  two transactions may run at once, so one that counts rows before it inserts (a launch's limits) first takes a
  transaction-level advisory lock of that name.
- `AdvisoryLock`: a lock for a process's lifetime (the scheduler's "one studio per database"), held by a
  PostgreSQL session-level advisory lock on a connection of its own; it goes with that connection, so a studio that
  dies (even by SIGKILL) never leaves it behind.

Advisory locks are per database: two studios on two databases of one server do not meet.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

from sqlalchemy import Float, Integer, create_engine, text
from sqlalchemy.dialects.postgresql import insert as _pg_insert
from sqlalchemy.dialects.sqlite import insert as _sqlite_insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.functions import FunctionElement

SQLITE, POSTGRESQL = "sqlite", "postgresql"
DIALECTS = (SQLITE, POSTGRESQL)


def dialect_of(bind: Session | Connection | Engine) -> str:
    if isinstance(bind, Session):
        bind = bind.get_bind()
    return bind.dialect.name


def insert(session: Session, table: Any):
    """An INSERT of `table` in the session's dialect (with its `on_conflict_*` upserts)."""
    return (_pg_insert if dialect_of(session) == POSTGRESQL else _sqlite_insert)(table)


class greatest(FunctionElement):
    """The larger of two values."""

    type = Float()
    name = "greatest"
    inherit_cache = True


@compiles(greatest)
def _greatest(element, compiler, **kw) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(greatest, SQLITE)
def _greatest_sqlite(element, compiler, **kw) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


class truncate(FunctionElement):
    """A number cut to an integer towards zero (a histogram's bin of a value above its start)."""

    type = Integer()
    name = "truncate"
    inherit_cache = True


@compiles(truncate)
def _truncate(element, compiler, **kw) -> str:
    return f"CAST(trunc({compiler.process(element.clauses, **kw)}) AS INTEGER)"


@compiles(truncate, SQLITE)
def _truncate_sqlite(element, compiler, **kw) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS INTEGER)"


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for a PostgreSQL advisory lock named `name` (in the studio's own key space)."""
    return int.from_bytes(hashlib.sha256(f"a2po-studio:{name}".encode()).digest()[:8], "big", signed=True)


def serialize(session: Session, name: str) -> None:
    """Make this write transaction wait for any other that called `serialize` with `name` (see the module)."""
    if dialect_of(session) == POSTGRESQL:
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(name)})


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock named `name` on the database at `url`, on a connection of its own
    that stays open while the lock is held (the scheduler's "one studio per database", as `flock` is for a file).

    `acquire(**owner)` raises `error` (a message naming who holds it) when another process has it; who holds it is
    read from the holder's connection (`application_name`: the studio's host, pid and `owner`), since the lock
    itself carries nothing.
    """

    def __init__(self, url: Any, name: str = "scheduler", error: type[Exception] = RuntimeError,
                 hint: str = "Stop it first, or start this one with another --db.") -> None:
        self.url = url
        self.name = name
        self.key = advisory_key(name)
        self.error = error
        self.hint = hint
        self._engine: Engine | None = None
        self._connection: Connection | None = None

    @property
    def held(self) -> bool:
        return self._connection is not None

    def acquire(self, **owner: Any) -> None:
        if self._connection is not None:
            return
        label = " ".join(["a2po-studio", socket.gethostname(), f"pid {os.getpid()}", *map(str, owner.values())])
        name = label.encode()[:63].decode(errors="ignore")  # NAMEDATALEN: PostgreSQL keeps 63 bytes of it
        engine = create_engine(self.url, poolclass=NullPool, connect_args={"application_name": name})
        connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            if connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}).scalar():
                self._engine, self._connection = engine, connection
                return
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

    def release(self) -> None:
        if self._connection is not None:
            try:
                self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})
            except Exception:  # noqa: BLE001 - a connection already gone has released the lock with it
                pass
            finally:
                self._connection.close()
                self._engine.dispose()
                self._connection = self._engine = None
