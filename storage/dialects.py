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

Advisory locks are per database: two studios on two databases of one server do not meet. The lock a studio holds
for its lifetime is in `storage.locks`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import Float, Integer, text
from sqlalchemy.dialects.postgresql import insert as _pg_insert
from sqlalchemy.dialects.sqlite import insert as _sqlite_insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
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


def _function(name: str, result: type, doc: str, sql: str, sqlite_sql: str) -> type[FunctionElement]:
    """A SQL function spelled `sql` on PostgreSQL and `sqlite_sql` on SQLite (`{}`: its arguments)."""
    function = type(name, (FunctionElement,), {"type": result(), "name": name, "inherit_cache": True, "__doc__": doc})

    def render(template: str):
        return lambda element, compiler, **kw: template.format(compiler.process(element.clauses, **kw))

    compiles(function)(render(sql))
    compiles(function, SQLITE)(render(sqlite_sql))
    return function


greatest = _function("greatest", Float, "The larger of two values.", "greatest({})", "max({})")
truncate = _function("truncate", Integer, "A number cut to an integer towards zero (a histogram's bin of a value "
                     "above its start).", "CAST(trunc({}) AS INTEGER)", "CAST({} AS INTEGER)")


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for a PostgreSQL advisory lock named `name` (in the studio's own key space)."""
    return int.from_bytes(hashlib.sha256(f"a2po-studio:{name}".encode()).digest()[:8], "big", signed=True)


def serialize(session: Session, name: str) -> None:
    """Make this write transaction wait for any other that called `serialize` with `name` (see the module)."""
    if dialect_of(session) == POSTGRESQL:
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(name)})
