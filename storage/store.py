"""`Store`: the one public entry point to the studio database (via the SQLAlchemy 2 ORM).

`Store(where)` takes a file path (a SQLite database: the default, embedded, one machine) or a SQLAlchemy URL:
`sqlite:///path` (the same file) or `postgresql+psycopg://user@host/db` (a server that workers on other machines
can write; `pip install 'a2po-studio[cluster]'`, docs/cluster.md). Both get the same schema (`storage.migrations`),
the same queries (what differs between the two is in `storage.dialects`) and the same methods.

Everything returned is a plain dict or list, so no ORM object (and no open session) leaks to callers.

Concurrency on SQLite: the UI process, the scheduler and one worker process write to the same file at once. The
database runs in WAL mode (readers never block the writer), every connection waits up to `busy_timeout` for a lock,
and write transactions start with `BEGIN IMMEDIATE`: they take the write lock up front, so a transaction never has
to upgrade a read lock later, which in SQLite fails at once with "database is locked" instead of waiting.

Concurrency on PostgreSQL (READ COMMITTED): writers run at once, so each write that reads before it writes locks
what it reads first: a run's state change is one `UPDATE ... WHERE id = ? AND status IN (...)`, a compare-and-set
that a second writer re-checks against the first one's committed row (so two processes never both apply
conflicting events); the writes that read a run's or a value set's counters lock its row (`SELECT ... FOR UPDATE`,
a no-op on SQLite, which holds the write lock anyway); a launch counts its limits under a transaction-level
advisory lock (`dialects.serialize`).

Durability: with `synchronous=NORMAL` in WAL mode a commit is atomic and the file is never corrupted, but the WAL
is synced to disk only at checkpoints, so a power cut (not a process crash: the OS still holds the data) can
roll back the last commits before it. That is fine for metrics, samples, logs and stage-1 rows (a resumed run
writes them again, the same values, since runs are reproducible); run state must not go back in time (a run
queued, claimed, finished or deleted, a checkpoint recorded), so those writes commit with `synchronous=FULL`.
A PostgreSQL server's commits are durable as it is configured (`synchronous_commit`, on by default).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, delete, event, func, or_, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session

from a2po.answers import CORRECT_THRESHOLD
from a2po.names import ACTIONS
from storage import dialects, lifecycle, locks, migrations, writes
from storage.dialects import insert
from storage.models import (
    Checkpoint,
    Evaluation,
    LatestMetric,
    LogLine,
    Metric,
    PromptValue,
    Run,
    RunValue,
    Sample,
    ValueSet,
)
from storage.secrets import scrub_secrets
from storage.views import DashboardReads, _distinct_in_index, _like_pattern
from storage.writes import json_safe

BUSY_TIMEOUT_MS = 30_000
MAX_ID = 2**63  # ids and steps are 64-bit integers in both dialects
RUN_CHILD_TABLES = (RunValue, Metric, LatestMetric, Sample, Evaluation, Checkpoint, LogLine)


def _make_engine(path: Path, synchronous: str = "NORMAL") -> Engine:
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy emit BEGIN itself (see `_on_begin`); the sqlite3 module's implicit BEGIN is deferred.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute(f"PRAGMA synchronous = {synchronous}")  # see "Durability" in the module docstring
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('sqlite_begin', 'DEFERRED')}")

    return engine


def _make_server_engine(url: URL) -> Engine:
    # A studio outlives server restarts and idle timeouts: a pooled connection is checked before each use.
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=20)


def locate(where: str | os.PathLike[str] | URL) -> tuple[URL, Path | None]:
    """The SQLAlchemy URL of a store given as a path or a URL, and its file (None for a server). A plain path (or
    `sqlite:///path`) is a SQLite file; `postgresql://` means the psycopg driver. Anything else is refused with
    what to give instead."""
    if isinstance(where, os.PathLike) or (isinstance(where, str) and "://" not in where):
        path = Path(where).expanduser().resolve()
        return URL.create("sqlite", database=str(path)), path
    try:
        url = make_url(where)
    except ArgumentError:
        raise ValueError(f"{where!r} is neither a file path nor a database URL: give a path (a SQLite file, e.g. "
                         "data/studio.db) or postgresql+psycopg://USER@HOST:PORT/DATABASE.") from None
    backend = url.get_backend_name()
    if backend == dialects.SQLITE:
        if url.database in (None, "", ":memory:") or url.query.get("mode") == "memory":
            raise ValueError(f"{url} is an in-memory SQLite database, which each process would see empty: give a "
                             "file (sqlite:///path/to/studio.db, or just the path).")
        path = Path(url.database).expanduser().resolve()
        return URL.create("sqlite", database=str(path)), path
    if backend == dialects.POSTGRESQL:
        if url.get_driver_name() not in ("psycopg", "postgresql", ""):
            raise ValueError(f"The PostgreSQL driver {url.get_driver_name()!r} is not supported: use "
                             "postgresql+psycopg://... (pip install 'a2po-studio[cluster]').")
        url = url.set(drivername="postgresql+psycopg")
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise ValueError(f"{url.render_as_string(hide_password=True)} needs the psycopg driver: "
                             "pip install 'a2po-studio[cluster]' (or pip install 'psycopg[binary]').") from None
        return url, None
    raise ValueError(f"The store runs on SQLite or PostgreSQL, not {backend!r} ({url.render_as_string()}): give a "
                     "path (a SQLite file) or postgresql+psycopg://USER@HOST:PORT/DATABASE.")


class LimitReached(ValueError):
    """A run `create_run` did not add: `count` runs already fill the `limit` of `what` ("queue" or "owner")."""

    def __init__(self, what: str, count: int, limit: int) -> None:
        self.what, self.count, self.limit = what, count, limit
        super().__init__(f"{count} runs already fill the {what} limit of {limit}.")


@dataclass(frozen=True)
class Admission:
    """Limits a new run must fit in (None: no limit): the queued runs of everyone together, and the runs of its
    owner in `owner_statuses` (a run without an owner is not counted against any)."""

    queue_size: int | None = None
    per_owner: int | None = None
    owner_statuses: tuple[str, ...] = lifecycle.UNFINISHED

    def check(self, session: Session, owner: str | None, count: int = 1) -> None:
        """Raise `LimitReached` if `count` more runs would exceed a limit (inside the inserting transaction)."""
        if self.queue_size is not None:
            queued = session.scalar(select(func.count()).select_from(Run).where(Run.status == lifecycle.QUEUED))
            if queued + count > self.queue_size:
                raise LimitReached("queue", queued, self.queue_size)
        if self.per_owner is not None and owner is not None:
            mine = session.scalar(select(func.count()).select_from(Run).where(
                Run.owner == owner, Run.status.in_(self.owner_statuses)))
            if mine + count > self.per_owner:
                raise LimitReached("owner", mine, self.per_owner)


class Store(DashboardReads):
    """Read and write runs, V* sets, metrics, samples, evaluations, checkpoints and logs in one database: a SQLite
    file (`where` a path) or a PostgreSQL database (`where` a `postgresql+psycopg://` URL).

    Safe to share between threads; safe across `fork` (a child process opens its own connections).
    """

    def __init__(self, where: str | os.PathLike[str] | URL) -> None:
        self._url, self.path = locate(where)  # path: the SQLite file, None on a server
        self.dialect = self._url.get_backend_name()
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._writer: Engine | None = None
        self._durable: Engine | None = None
        self._pid = -1
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            migrations.upgrade(self.path)  # the chain of before Alembic, for files it wrote
        # One transaction that holds the database's write lock (BEGIN IMMEDIATE on SQLite, an advisory lock on
        # PostgreSQL): two processes may open the store at once.
        with self._lock, self._engines()[1].begin() as conn:
            migrations.ensure_schema(conn)

    @property
    def url(self) -> str:
        """The database as a URL (with its password, if it has one: what another process opens it with)."""
        return self._url.render_as_string(hide_password=False)

    def __repr__(self) -> str:
        return f"Store({str(self.path) if self.path is not None else self._url.render_as_string()!r})"

    def scheduler_lock(self, error: type[Exception] = RuntimeError, hint: str | None = None
                       ) -> locks.FileLock | locks.AdvisoryLock:
        """The scheduler's "one studio per database" lock (`storage.locks`): a `flock` beside a SQLite file, an
        advisory lock on a server; `acquire` raises `error` when another studio holds it."""
        extra = {"hint": hint} if hint else {}
        if self.dialect == dialects.SQLITE:
            return locks.FileLock(self.path.parent, error=error, **extra)
        return locks.AdvisoryLock(self._url, "scheduler", error=error, **extra)

    # ------------------------------------------------------------------ plumbing

    def _engines(self) -> tuple[Engine, Engine, Engine]:
        """(reader, writer, durable writer) engines of this process; a forked child must not reuse its parent's
        connections."""
        if self._pid != os.getpid():
            for engine in (self._engine, self._durable):
                if engine is not None:
                    engine.dispose(close=False)  # drop the parent's pooled connections without closing them
            if self.path is not None:
                self._engine = _make_engine(self.path)
                self._writer = self._engine.execution_options(sqlite_begin="IMMEDIATE")
                self._durable = _make_engine(self.path, synchronous="FULL").execution_options(
                    sqlite_begin="IMMEDIATE")
            else:  # a server: one pool; every commit is as durable as the server makes it
                self._engine = self._writer = self._durable = _make_server_engine(self._url)
            self._pid = os.getpid()
        return self._engine, self._writer, self._durable

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._lock:
            engine = self._engines()[0]
        with Session(engine) as session:
            yield session

    @contextmanager
    def _write(self, durable: bool = False) -> Iterator[Session]:
        """A write transaction; `durable` commits it with `synchronous=FULL` (see the module docstring)."""
        with self._lock:
            engine = self._engines()[2 if durable else 1]
        with Session(engine) as session, session.begin():
            yield session

    def close(self) -> None:
        """Close this process's connections (a later call reopens them)."""
        with self._lock:
            if self._pid == os.getpid():
                for engine in {id(e): e for e in (self._engine, self._durable) if e is not None}.values():
                    engine.dispose()
            self._engine = self._writer = self._durable = None
            self._pid = -1

    @staticmethod
    def _rows(session: Session, stmt) -> list[dict[str, Any]]:
        result = session.execute(stmt)
        keys = list(result.keys())
        return [dict(zip(keys, row, strict=True)) for row in result]  # much faster per row than `.mappings()`

    # ------------------------------------------------------------------ runs

    def create_run(self, name: str, action: str, spec: dict[str, Any], model: str = "", dataset: str = "",
                   parent_run_id: int | None = None, owner: str | None = None, num_processes: int = 1,
                   admission: Admission | None = None) -> int:
        """Add a queued run; `spec` (the whole run spec, minus any credential in it) is stored as its config.
        Returns the new run id (never one a deleted run had). With `admission`, its limits are counted in the
        transaction that inserts the run (`BEGIN IMMEDIATE`: no other writer in between), so launches that arrive
        together cannot pass a limit together; `LimitReached` when the run would exceed one, and nothing is stored."""
        if action not in ACTIONS:
            raise ValueError(f"Unknown run action {action!r}: use one of {', '.join(ACTIONS)}.")
        now = time.time()
        with self._write(durable=True) as s:
            if admission is not None:
                dialects.serialize(s, "admission")  # the count and the insert, one launch at a time
                admission.check(s, owner)
            run = Run(name=name, action=action, status="queued", config=json_safe(scrub_secrets(spec)),
                      model=model, dataset=dataset, created_at=now, queued_at=now, parent_run_id=parent_run_id,
                      progress=0.0, owner=owner, num_processes=int(num_processes), auto_resumes=0, launch_failures=0)
            s.add(run)
            s.flush()
            return run.id

    def check_admission(self, admission: Admission, owner: str | None, count: int) -> None:
        """Raise `LimitReached` if `count` more runs would not fit in `admission`'s limits now: a study's runs are
        refused whole before any is queued (each is counted again when it is inserted)."""
        with self._read() as s:
            admission.check(s, owner, count)

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        try:
            run_id = int(run_id)
        except (TypeError, ValueError):
            return None
        if not 0 <= run_id < MAX_ID:
            return None  # not an id a row can have (the driver would fail to bind it)
        with self._read() as s:
            rows = self._rows(s, select(Run.__table__).where(Run.id == run_id))
        return rows[0] if rows else None

    def list_runs(self, status: str | Iterable[str] | None = None) -> list[dict[str, Any]]:
        """All runs, newest first; `status` keeps only runs in that status (or any of several)."""
        stmt = select(Run.__table__).order_by(Run.created_at.desc(), Run.id.desc())
        if status is not None:
            stmt = stmt.where(Run.status.in_([status] if isinstance(status, str) else list(status)))
        with self._read() as s:
            return self._rows(s, stmt)

    def delete_run(self, run_id: int) -> bool:
        """Remove a run and all its rows (metrics, samples, evaluations, checkpoints, logs); value sets stay."""
        with self._write(durable=True) as s:
            # Explicit deletes: correct even on a database file opened elsewhere without foreign keys on.
            for table in RUN_CHILD_TABLES:
                s.execute(delete(table).where(table.run_id == run_id))
            s.execute(update(Run).where(Run.parent_run_id == run_id).values(parent_run_id=None))
            return s.execute(delete(Run).where(Run.id == run_id)).rowcount == 1

    # ------------------------------------------------------------------ value sets

    def get_or_create_value_set(self, fingerprint: str, meta: dict[str, Any]) -> int:
        """The id of the value set with this fingerprint, created (incomplete, empty) if there is none."""
        with self._write() as s:
            s.execute(insert(s, ValueSet).values(fingerprint=fingerprint, meta=json_safe(meta), created_at=time.time(),
                                              complete=False, counts={})
                      .on_conflict_do_nothing(index_elements=["fingerprint"]))
            return s.scalar(select(ValueSet.id).where(ValueSet.fingerprint == fingerprint))

    def _value_sets(self, where=None) -> list[dict[str, Any]]:
        stmt = select(ValueSet.__table__).order_by(ValueSet.id.desc())
        if where is not None:
            stmt = stmt.where(where)
        with self._read() as s:
            rows = self._rows(s, stmt)
        for row in rows:
            row["counts"] = row.get("counts") or {}
            row["num_values"] = sum(row["counts"].values())
        return rows

    def find_value_set(self, fingerprint: str) -> dict[str, Any] | None:
        rows = self._value_sets(ValueSet.fingerprint == fingerprint)
        return rows[0] if rows else None

    def get_value_set(self, value_set_id: int) -> dict[str, Any] | None:
        rows = self._value_sets(ValueSet.id == value_set_id)
        return rows[0] if rows else None

    def list_value_sets(self) -> list[dict[str, Any]]:
        """All value sets, newest first, each with `counts` (stored prompts per split) and `num_values` (all)."""
        return self._value_sets()

    # ------------------------------------------------------------------ prompt values

    def value_set_cost(self, value_set_id: int) -> dict[str, dict[str, float]]:
        """What sampling the set's stored prompts cost, per split: `seconds`, `tokens`, `flops` and the `prompts` they
        sampled ({} when not known: see `storage.models.ValueSet.cost`)."""
        with self._read() as s:
            return s.scalar(select(ValueSet.cost).where(ValueSet.id == value_set_id)) or {}

    def get_values(self, value_set_id: int, split: str | None = "train") -> list[dict[str, Any]]:
        """Stored prompt values of one split (all splits with `split=None`), in insertion order."""
        stmt = select(PromptValue.__table__).where(PromptValue.value_set_id == value_set_id).order_by(PromptValue.id)
        if split is not None:
            stmt = stmt.where(PromptValue.split == split)
        with self._read() as s:
            return self._rows(s, stmt)

    def count_values(self, value_set_id: int, split: str | None = "train") -> int:
        """Stored prompts of one split (all splits with `split=None`): a counter, not a count of rows."""
        with self._read() as s:
            counts = s.scalar(select(ValueSet.counts).where(ValueSet.id == value_set_id)) or {}
        return sum(counts.values()) if split is None else int(counts.get(split, 0))

    def value_splits(self, value_set_id: int) -> list[str]:
        with self._read() as s:
            counts = s.scalar(select(ValueSet.counts).where(ValueSet.id == value_set_id)) or {}
        return sorted(split for split, n in counts.items() if n)

    # ------------------------------------------------------------------ metrics

    def latest_metrics(self, run_id: int) -> dict[str, dict[str, Any]]:
        """`{name: {"step", "value"}}`: each metric's value at its highest step (one row per name, no scan)."""
        stmt = select(LatestMetric.name, LatestMetric.step, LatestMetric.value).where(LatestMetric.run_id == run_id)
        with self._read() as s:
            return {name: {"step": step, "value": value} for name, step, value in s.execute(stmt)}

    def run_clocks(self, run_ids: Iterable[int]) -> dict[int, dict[str, float]]:
        """Each run's clock as its trainer last logged it (`a2po.callbacks.RunCounters`): `train_seconds`,
        `eval_seconds`, `step_seconds`, the stage-1 `values/<split>/runtime`, and `step` (where `train_seconds` was
        logged) with the `epoch` there, by run id, in one read; a run with none is left out."""
        ids = [int(i) for i in run_ids]
        if not ids:
            return {}
        stmt = select(LatestMetric.run_id, LatestMetric.name, LatestMetric.step, LatestMetric.value).where(
            LatestMetric.run_id.in_(ids),
            or_(LatestMetric.name.in_(("train_seconds", "eval_seconds", "step_seconds", "epoch")),
                LatestMetric.name.like("values/%/runtime")))
        clocks: dict[int, dict[str, float]] = {}
        epochs: dict[int, tuple[int, float]] = {}
        with self._read() as s:
            for run_id, name, step, value in s.execute(stmt):
                if value is None:
                    continue
                if name == "epoch":
                    epochs[run_id] = (step, float(value))
                    continue
                clocks.setdefault(run_id, {})[name] = float(value)
                if name == "train_seconds":
                    clocks[run_id]["step"] = float(step)
        for run_id, (step, epoch) in epochs.items():
            if run_id in clocks and clocks[run_id].get("step") == step:
                clocks[run_id]["epoch"] = epoch
        return clocks

    def get_metrics(self, run_id: int, after_id: int = 0, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Metric rows (id, step, name, value, created_at) with id > `after_id`, oldest first.

        `value` is None where the logged value was NaN. Poll with the largest id seen so far.
        """
        stmt = (select(Metric.id, Metric.step, Metric.name, Metric.value, Metric.created_at)
                .where(Metric.run_id == run_id, Metric.id > after_id).order_by(Metric.id))
        if names is not None:
            stmt = stmt.where(Metric.name.in_(list(names)))
        with self._read() as s:
            return self._rows(s, stmt)

    def metric_names(self, run_id: int) -> list[str]:
        with self._read() as s:
            return sorted(s.scalars(select(LatestMetric.name).where(LatestMetric.run_id == run_id)))

    def last_ids(self, run_id: int) -> dict[str, int]:
        """Largest row id per table (metrics, samples, logs, evaluations, checkpoints) for one run, in one read."""
        names = {"metrics": Metric, "samples": Sample, "logs": LogLine, "evaluations": Evaluation,
                 "checkpoints": Checkpoint}
        stmt = select(*[select(func.coalesce(func.max(t.id), 0)).where(t.run_id == run_id).scalar_subquery()
                        .label(name) for name, t in names.items()])
        with self._read() as s:
            return dict(s.execute(stmt).mappings().one())

    # ------------------------------------------------------------------ samples

    def get_samples(self, run_id: int, after_id: int = 0, correct: bool | None = None, text: str | None = None,
                    step: int | None = None, split: str | None = None, limit: int | None = 500,
                    newest_first: bool = False) -> list[dict[str, Any]]:
        """Samples of a run with id > `after_id`, oldest first (or newest first), at most `limit` rows.

        `correct` keeps rewards >= CORRECT_THRESHOLD (True) or below (False); `text` is a case-insensitive substring
        of the prompt or the completion.
        """
        stmt = select(Sample.__table__).where(Sample.run_id == run_id, Sample.id > after_id)
        stmt = _filter_samples(stmt, correct, text)
        if step is not None:
            stmt = stmt.where(Sample.step == step)
        if split is not None:
            stmt = stmt.where(Sample.split == split)
        stmt = stmt.order_by(Sample.id.desc() if newest_first else Sample.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return self._rows(s, stmt)

    # The completions table reads a run's samples by step and by prompt. The unique index (run_id, split, step,
    # prompt_id, sample_index) answers both with seeks: the steps by a loose index scan (one seek per step, not a
    # read of every row), a prompt's rows by one seek per (step, prompt).

    def sample_splits(self, run_id: int) -> list[str]:
        """The splits a run logged samples of ("train"; "eval" for its evaluations' greedy completions)."""
        with self._read() as s:
            return [str(x) for x in s.scalars(_distinct_in_index(Sample.split, [Sample.run_id == run_id]))]

    def sample_steps(self, run_id: int, split: str = "train") -> list[int]:
        """The steps at which a run logged samples of `split`, in order."""
        with self._read() as s:
            return [int(x) for x in s.scalars(
                _distinct_in_index(Sample.step, [Sample.run_id == run_id, Sample.split == split]))]

    def step_samples(self, run_id: int, step: int, split: str = "train", correct: bool | None = None,
                     text: str | None = None, sort: str = "prompt", descending: bool = False,
                     limit: int | None = 2000) -> list[dict[str, Any]]:
        """The samples a run logged at one step: filtered like `get_samples` and sorted by `sort` ("prompt",
        "reward", "advantage" or "v_star"; empty values last), a prompt's completions in index order among equals."""
        if sort not in SAMPLE_SORTS:
            raise ValueError(f"Unknown sample sort {sort!r}: use one of {', '.join(SAMPLE_SORTS)}.")
        stmt = select(Sample.__table__).where(Sample.run_id == run_id, Sample.split == split, Sample.step == step)
        stmt = _filter_samples(stmt, correct, text)
        if sort != "prompt":
            column = getattr(Sample, sort)
            stmt = stmt.order_by(column.is_(None), column.desc() if descending else column)
        stmt = stmt.order_by(Sample.prompt_id, Sample.sample_index)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return self._rows(s, stmt)

    def prompt_samples(self, run_id: int, prompt_id: str, split: str = "train",
                       at_or_below: int | None = None) -> list[dict[str, Any]]:
        """One prompt's samples in a run, by step and index: at every step that sampled it, or with `at_or_below`
        only at the latest such step not after it (none when the run first sampled it later)."""
        steps = _distinct_in_index(Sample.step, [Sample.run_id == run_id, Sample.split == split]).subquery()
        where = (Sample.run_id == run_id, Sample.split == split, Sample.prompt_id == str(prompt_id))
        with self._read() as s:
            # The prompt's steps from the index alone (one seek per logged step), then its rows at those steps.
            sampled = list(s.scalars(select(Sample.step).distinct().where(*where, Sample.step.in_(select(steps)))
                                     .order_by(Sample.step)))
            if at_or_below is not None:
                sampled = [step for step in sampled if step <= at_or_below][-1:]
            if not sampled:
                return []
            stmt = (select(Sample.__table__).where(*where, Sample.step.in_(sampled))
                    .order_by(Sample.step, Sample.sample_index))
            return self._rows(s, stmt)

    # ------------------------------------------------------------------ evaluations

    def get_evaluations(self, run_id: int) -> list[dict[str, Any]]:
        stmt = select(Evaluation.__table__).where(Evaluation.run_id == run_id).order_by(Evaluation.step,
                                                                                        Evaluation.id)
        with self._read() as s:
            return self._rows(s, stmt)

    # ------------------------------------------------------------------ checkpoints

    def list_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        stmt = select(Checkpoint.__table__).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step,
                                                                                        Checkpoint.id)
        with self._read() as s:
            return self._rows(s, stmt)

    def latest_checkpoint(self, run_id: int) -> dict[str, Any] | None:
        """The checkpoint with the highest step (the newest among equals), or None."""
        rows = self.list_checkpoints(run_id)
        return max(rows, key=lambda r: (r["step"], r["id"])) if rows else None

    # ------------------------------------------------------------------ the writes of a run's worker
    # One method per entry of `storage.writes.WRITES`, with the signature and the meaning `RunWriter` declares.

    def _commit(self, name: str, *args: Any, **kwargs: Any) -> Any:
        write = writes.WRITES[name]
        with self._write(durable=write.durable) as s:
            return write.function(s, *args, **kwargs)

    def update_run(self, run_id: int, **fields: Any) -> bool:
        return self._commit("update_run", run_id, **fields)

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        self._commit("heartbeat", run_id, **fields)

    def record_progress(self, run_id: int, **fields: Any) -> None:
        self._commit("record_progress", run_id, **fields)

    def apply(self, run_id: int, event: lifecycle.Event, *, seconds: float | None = None, **fields: Any) -> bool:
        return self._commit("apply", run_id, event, seconds=seconds, **fields)

    def add_values(self, value_set_id: int, split: str, records: Iterable[Mapping[str, Any]],
                   seconds: float = 0.0, tokens: int = 0, flops: float = 0.0) -> int:
        return self._commit("add_values", value_set_id, split, records, seconds, tokens, flops)

    def set_run_values(self, run_id: int, split: str, rows: Iterable[Mapping[str, Any]],
                       replace: bool = False) -> int:
        return self._commit("set_run_values", run_id, split, rows, replace)

    def mark_value_set_complete(self, value_set_id: int, summary: dict[str, Any] | None = None) -> None:
        self._commit("mark_value_set_complete", value_set_id, summary)

    def update_value_set_summary(self, value_set_id: int, summary: dict[str, Any]) -> None:
        self._commit("update_value_set_summary", value_set_id, summary)

    def add_metrics(self, run_id: int, step: int, metrics: Mapping[str, Any]) -> int:
        return self._commit("add_metrics", run_id, step, metrics)

    def add_samples(self, run_id: int, samples: Iterable[Mapping[str, Any]]) -> int:
        return self._commit("add_samples", run_id, samples)

    def add_evaluation(self, run_id: int, step: int, metrics: Mapping[str, Any], split: str = "eval") -> None:
        self._commit("add_evaluation", run_id, step, metrics, split)

    def add_checkpoint(self, run_id: int, step: int, path: str | os.PathLike[str]) -> None:
        self._commit("add_checkpoint", run_id, step, path)

    def remove_checkpoint(self, run_id: int, path: str | os.PathLike[str]) -> bool:
        return self._commit("remove_checkpoint", run_id, path)

    def add_log(self, run_id: int, message: str, level: str = "INFO") -> None:
        self._commit("add_log", run_id, message, level)

    def add_logs(self, run_id: int, lines: Iterable[tuple[str, str]]) -> None:
        lines = list(lines)
        if lines:
            self._commit("add_logs", run_id, lines)

    def apply_journal(self, run_id: int, ops: Iterable[tuple[str, Mapping[str, Any]]], offset: int) -> bool:
        """Make the writes a chunk process recorded in its journal (each a name of `storage.writes.WRITES` and the
        keyword arguments of that method, with `at`: when it happened) and store the journal position `offset` they
        reach, in one transaction: a journal is applied exactly once, whatever is killed when. False (nothing
        written) if the run is gone."""
        ops = list(ops)
        with self._write(durable=writes.durable(name for name, _ in ops)) as s:
            if s.execute(update(Run).where(Run.id == run_id).values(journal_offset=int(offset))).rowcount != 1:
                return False
            for name, arguments in ops:
                writes.replay(s, run_id, name, arguments)
            return True

    def reset_journal(self, run_id: int) -> None:
        """The run's journal was emptied (after its chunk was settled): read it from the start next time."""
        with self._write() as s:
            s.execute(update(Run).where(Run.id == run_id).values(journal_offset=0))

    # ------------------------------------------------------------------ logs

    def get_logs(self, run_id: int, after_id: int = 0, limit: int | None = 1000) -> list[dict[str, Any]]:
        """Log lines with id > `after_id`, oldest first."""
        stmt = (select(LogLine.__table__).where(LogLine.run_id == run_id, LogLine.id > after_id)
                .order_by(LogLine.id))
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return self._rows(s, stmt)


SAMPLE_SORTS = ("prompt", "reward", "advantage", "v_star")


def _filter_samples(stmt: Any, correct: bool | None, text: str | None) -> Any:
    """`stmt` keeping rewards >= CORRECT_THRESHOLD (`correct` True) or below (False, unscored included), and rows
    whose prompt or completion contains `text` (case-insensitive)."""
    if correct is not None:
        stmt = stmt.where(Sample.reward >= CORRECT_THRESHOLD if correct
                          else or_(Sample.reward < CORRECT_THRESHOLD, Sample.reward.is_(None)))
    if text:
        pattern = _like_pattern(text)
        stmt = stmt.where(or_(Sample.prompt_text.ilike(pattern, escape="\\"),
                              Sample.completion.ilike(pattern, escape="\\")))
    return stmt
