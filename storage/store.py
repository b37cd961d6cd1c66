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

import math
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, Integer, cast, create_engine, delete, event, func, literal, or_, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session

from a2po.answers import CORRECT_THRESHOLD, prompt_question
from a2po.names import ACTIONS
from storage import dialects, lifecycle, locks, migrations, writes
from storage.dialects import insert, truncate
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
from storage.writes import RUN_OWN, json_safe

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


def _with_questions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        prompt = row.pop("prompt", None)
        row["question"] = row["prompt_text"] if prompt is None else prompt_question(prompt)
    return rows


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


class Store:
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

    # ------------------------------------------------------------------ dashboard reads: paged, aggregated, streamed
    # A run can hold 100k prompts with N completions each, a million samples and hundreds of thousands of metric
    # rows. The dashboard reads it through these methods: aggregates are computed in SQL (from covering indexes
    # where they exist), tables come a page at a time without their wide columns, and exports stream in id order,
    # one short read per batch (a read transaction held open for a whole export would stop the WAL from being
    # checkpointed while a worker writes).

    def value_stats(self, run_id: int, split: str = "train", bins: int = 30) -> dict[str, Any]:
        """What the V* tab draws for one split of a run (the V* and filter the run trained with), computed in SQL
        from the covering index `ix_run_values_stats` alone (no wide row is read, whatever the size of the split):

        `count`, `filtered`, `with_v_star`, `mean_v_star`, `min_v_star`, `max_v_star`; `sampled` (prompts with
        reference samples), `num_samples` (N), `pass_at_1` and `pass_at_n` (the reference policy's, from the
        correct counts), `correct` (prompts with k correct samples, k = 0..N), and `histogram`: `start`, `width`
        and the per-bin counts of `kept` and `filtered` prompts (about `bins` bins of a round width).
        """
        rv = RunValue
        where = (rv.run_id == run_id, rv.split == split)
        with self._read() as s:
            # Two index seeks (min and max read one entry each), then one pass over the index: grouped by its own
            # columns, so SQLite streams it without sorting. Binary rewards give 2 (N + 1) groups at most; a split
            # with more distinct V* values than `STATS_GROUPS` is binned in SQL instead (a sort of index entries).
            lo = s.scalar(select(func.min(rv.v_star)).where(*where))
            hi = s.scalar(select(func.max(rv.v_star)).where(*where))
            start, width, nbins = _histogram_bins(lo, hi, bins)
            keys = (rv.v_star, rv.num_correct, rv.filtered)
            groups = s.execute(select(*keys, func.count(), func.sum(rv.v_star)).where(*where).group_by(*keys)
                               .limit(STATS_GROUPS + 1)).all()
            if len(groups) > STATS_GROUPS:
                keys = (truncate((rv.v_star - start) / width), rv.num_correct, rv.filtered)
                groups = s.execute(select(*keys, func.count(), func.sum(rv.v_star)).where(*where)
                                   .group_by(*keys)).all()
            else:
                groups = [(None if v is None else int((v - start) / width), *rest) for v, *rest in groups]
            n = self._num_samples(s, run_id, split)
        count = filtered = with_v = sampled = correct_sum = any_correct = 0
        v_sum = 0.0
        kept_bins, filtered_bins, correct = [0] * nbins, [0] * nbins, {}
        for b, k, is_filtered, c, v in groups:
            count += c
            filtered += c if is_filtered else 0
            if b is not None:
                (filtered_bins if is_filtered else kept_bins)[min(max(int(b), 0), nbins - 1)] += c
                with_v += c
                v_sum += v
            if k is not None:
                sampled += c
                correct[k] = correct.get(k, 0) + c
                correct_sum += k * c
                any_correct += c if k > 0 else 0
        n = max(int(n), max(correct, default=0))
        return {"count": count, "filtered": filtered, "with_v_star": with_v,
                "mean_v_star": v_sum / with_v if with_v else None, "min_v_star": lo, "max_v_star": hi,
                "sampled": sampled, "num_samples": n,
                "pass_at_1": correct_sum / (sampled * n) if sampled and n else None,
                "pass_at_n": any_correct / sampled if sampled else None,
                "correct": [correct.get(k, 0) for k in range(n + 1)] if sampled else [],
                "histogram": {"start": start, "width": width, "kept": kept_bins, "filtered": filtered_bins}}

    @staticmethod
    def _num_samples(s: Session, run_id: int, split: str) -> int:
        """N, the reference samples per prompt, from one shared row of the split (0 when none was sampled)."""
        rv, pv = RunValue, PromptValue
        return s.scalar(select(func.json_array_length(pv.rewards)).select_from(rv).join(pv, pv.id == rv.value_id)
                        .where(rv.run_id == run_id, rv.split == split, rv.num_correct.is_not(None)).limit(1)) or 0

    def value_summary(self, run_id: int) -> dict[str, dict[str, Any]]:
        """Per split of the run, what stage 1 gave it (`a2po.values.summarize`'s figures, from the run's own rows):
        `num_prompts`, `num_filtered`, `mean_v_star`, `num_value_samples` (N), `pass_at_1`, `pass_at_n`. One pass
        over the covering index per split."""
        rv = RunValue
        out: dict[str, dict[str, Any]] = {}
        with self._read() as s:
            counts = s.scalar(select(Run.value_counts).where(Run.id == run_id)) or {}
            for split in sorted(name for name, rows in counts.items() if rows):
                count, filtered, mean, sampled, correct_sum, any_correct = s.execute(
                    select(func.count(), func.coalesce(func.sum(cast(rv.filtered, Integer)), 0), func.avg(rv.v_star),
                           func.count(rv.num_correct), func.coalesce(func.sum(rv.num_correct), 0),
                           func.coalesce(func.sum(cast(rv.num_correct > 0, Integer)), 0))
                    .where(rv.run_id == run_id, rv.split == split)).one()
                n = self._num_samples(s, run_id, split)
                out[split] = {"num_prompts": count, "num_filtered": int(filtered), "mean_v_star": mean,
                              "num_value_samples": n,
                              "pass_at_1": correct_sum / (sampled * n) if sampled and n else None,
                              "pass_at_n": any_correct / sampled if sampled else None}
        return out

    def values_page(self, run_id: int, split: str = "train", *, text: str | None = None,
                    filtered: bool | None = None, sort: str = "id", descending: bool = False, offset: int = 0,
                    limit: int = 200, text_chars: int = 300) -> list[dict[str, Any]]:
        """One page of a run's prompts of one split for a table: `id` (the shared row's), `prompt_id`, the first
        `text_chars` characters of `prompt_text` (the templated text the model saw), `question` (what the user
        asked: the last user message), and the run's own `v_star`, `num_correct`, `filtered` (never the
        completions or rewards).

        `sort` is one of `VALUE_SORTS` ("id" is the order stage 1 stored them in), ties broken by id; `text` keeps
        prompts whose text or id contains it (case-insensitive for ASCII); `filtered` keeps only the filtered
        (True) or the kept (False) prompts. Without `text` the page is chosen from the run's indexes (sorting
        100k index entries, not 100k rows with their completions) and only its rows are read.
        """
        if sort not in VALUE_SORTS:
            raise ValueError(f"Unknown sort {sort!r}: use one of {', '.join(VALUE_SORTS)}.")
        rv, pv = RunValue, PromptValue
        key = rv.value_id if sort == "id" else getattr(rv, sort)
        order = [key.desc(), rv.value_id.desc()] if descending else [key.asc(), rv.value_id.asc()]
        where = [rv.run_id == run_id, rv.split == split]
        if filtered is not None:
            where.append(rv.filtered == bool(filtered))
        page = select(rv.value_id)
        if text:
            pattern = _like_pattern(text)
            page = page.join(pv, pv.id == rv.value_id)
            # SQLite's LIKE ignores ASCII case; PostgreSQL's does not, its ILIKE does.
            like = "ilike" if self.dialect == dialects.POSTGRESQL else "like"
            where.append(or_(getattr(pv.prompt_text, like)(pattern, escape="\\"),
                             getattr(rv.prompt_id, like)(pattern, escape="\\")))
        page = page.where(*where).order_by(*order).offset(max(0, offset)).limit(max(0, limit))
        with self._read() as s:
            ids = list(s.scalars(page))
            # Then the page's rows by their ids, put in the page's order here: ordered in SQL, the planner would
            # walk the whole split in the sort's index to find them.
            stmt = (select(*_page_columns(text_chars)).select_from(rv).join(pv, pv.id == rv.value_id)
                    .where(rv.run_id == run_id, rv.split == split, rv.value_id.in_(ids)))
            rows = {row["id"]: row for row in self._rows(s, stmt)} if ids else {}
        return _with_questions([rows[i] for i in ids if i in rows])

    def get_value(self, run_id: int, split: str, prompt_id: str) -> dict[str, Any] | None:
        """One prompt of a run: the shared row, with its rewards and completions, and the run's own `v_star`,
        `num_correct`, `filtered` (two index lookups), or None."""
        rv, pv = RunValue, PromptValue
        stmt = (select(*_VALUE_ROW).select_from(rv).join(pv, pv.id == rv.value_id)
                .where(rv.run_id == run_id, rv.split == split, rv.prompt_id == str(prompt_id)))
        with self._read() as s:
            rows = self._rows(s, stmt)
        return rows[0] if rows else None

    def values_after(self, run_id: int, split: str | None = "train", after_id: int = 0,
                     limit: int | None = None) -> list[dict[str, Any]]:
        """A run's prompt rows whose shared row's id is > `after_id`, oldest first, without their wide columns (as
        `values_page`): what stage 1 gave the run since a poller last looked. Cost follows the rows after
        `after_id`, not the split's size."""
        rv, pv = RunValue, PromptValue
        stmt = (select(*_page_columns(300)).select_from(rv).join(pv, pv.id == rv.value_id)
                .where(rv.run_id == run_id, rv.value_id > after_id).order_by(rv.value_id))
        if split is not None:
            stmt = stmt.where(rv.split == split)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return _with_questions(self._rows(s, stmt))

    def metric_series(self, run_id: int, names: Iterable[str] | None = None,
                      max_points: int = 1000) -> dict[str, dict[str, list[Any]]]:
        """Per metric name, its curve downsampled in SQL to at most about `max_points` points:
        `{name: {"step", "value", "count", "min", "max"}}`, one list entry per point.

        Short runs come back whole (`count` 1, `min` = `max` = `value`). Longer ones are cut into about
        `max_points / 2` step buckets of the same width: `step` is a bucket's last step, `value` its mean,
        `count` how many rows it holds, `min` / `max` its extremes (a chart draws the extremes, so a spike is never
        averaged away, and smooths the means weighted by `count`). Missing (NaN) values are None.
        """
        with self._read() as s:
            known = select(LatestMetric.name, LatestMetric.step).where(LatestMetric.run_id == run_id)
            if names is not None:
                known = known.where(LatestMetric.name.in_(list(names)))
            last = dict(s.execute(known).all())
            if not last:
                return {}
            width = max(1, math.ceil((max(last.values()) + 1) / max(1, max_points // 2)))
            m = Metric
            where = (m.run_id == run_id, m.name.in_(list(last)))
            if width == 1:
                rows = s.execute(select(m.name, m.step, literal(1), m.value, m.value, m.value).where(*where)
                                 .order_by(m.name, m.step)).all()
            else:
                bucket = m.step // width
                rows = s.execute(select(m.name, func.max(m.step), func.count(), func.avg(m.value),
                                        func.min(m.value), func.max(m.value))
                                 .where(*where).group_by(m.name, bucket).order_by(m.name, bucket)).all()
        out: dict[str, dict[str, list[Any]]] = {}
        for name, step, count, value, lo, hi in rows:
            series = out.setdefault(name, {"step": [], "value": [], "count": [], "min": [], "max": []})
            for key, item in zip(("step", "value", "count", "min", "max"), (step, value, count, lo, hi), strict=True):
                series[key].append(item)
        return out

    def step_times(self, run_id: int, name: str = "loss", max_points: int = 2000) -> list[tuple[int, float]]:
        """(step, unix time the step was logged) for a chart's time axis: from the `name` metric (one row per
        logged step), every k-th row when there are more than `max_points`; [] before the first."""
        m = Metric
        where = (m.run_id == run_id, m.name == name)
        with self._read() as s:
            count = s.execute(select(func.count()).select_from(m).where(*where)).scalar_one()
            stride = max(1, math.ceil(count / max_points))
            rows = s.execute(select(m.step, m.created_at).where(*where).order_by(m.step)).all()
        picked = rows[::stride]
        if rows and picked[-1] != rows[-1]:
            picked.append(rows[-1])
        return [(int(step), float(at)) for step, at in picked]

    def iter_values(self, run_id: int, split: str | None = None, batch: int = 2000) -> Iterator[dict[str, Any]]:
        """Every prompt row of a run (one split, or all, each in stage-1 order): the shared row's columns with the
        run's own `v_star`, `num_correct`, `filtered`, `batch` rows per read: the memory of one batch whatever the
        size of the set."""
        rv, pv = RunValue, PromptValue
        if split is None:
            first = func.min(rv.value_id)
            with self._read() as s:
                splits = list(s.scalars(select(rv.split).where(rv.run_id == run_id).group_by(rv.split)
                                        .order_by(first)))
        else:
            splits = [split]
        for name in splits:
            last = 0
            while True:
                stmt = (select(*_VALUE_ROW).select_from(rv).join(pv, pv.id == rv.value_id)
                        .where(rv.run_id == run_id, rv.split == name, rv.value_id > last)
                        .order_by(rv.value_id).limit(batch))
                with self._read() as s:
                    rows = self._rows(s, stmt)
                yield from rows
                if len(rows) < batch:
                    break
                last = rows[-1]["id"]

    def iter_samples(self, run_id: int, batch: int = 5000) -> Iterator[dict[str, Any]]:
        """Every sample row of a run, in id order, `batch` rows per read."""
        yield from self._iterate(Sample, [Sample.run_id == run_id], batch)

    def iter_metrics(self, run_id: int, batch: int = 20000) -> Iterator[dict[str, Any]]:
        """Every metric row of a run (id, step, name, value, created_at), in id order, `batch` rows per read."""
        yield from self._iterate(Metric, [Metric.run_id == run_id], batch,
                                 columns=(Metric.id, Metric.step, Metric.name, Metric.value, Metric.created_at))

    def iter_logs(self, run_id: int, batch: int = 5000) -> Iterator[dict[str, Any]]:
        """Every log line of a run, in id order, `batch` rows per read."""
        yield from self._iterate(LogLine, [LogLine.run_id == run_id], batch)

    def _iterate(self, table, where: list[Any], batch: int, columns: tuple[Any, ...] | None = None
                 ) -> Iterator[dict[str, Any]]:
        """Rows of `table` matching `where` in id order, one short read of `batch` rows at a time (keyset paging:
        each read starts after the last id seen, so no read costs more than its batch)."""
        last = 0
        while True:
            stmt = (select(*(columns or (table.__table__,))).where(*where, table.id > last)
                    .order_by(table.id).limit(batch))
            with self._read() as s:
                rows = self._rows(s, stmt)
            yield from rows
            if len(rows) < batch:
                return
            last = rows[-1]["id"]


VALUE_SORTS = ("id", "prompt_id", "v_star", "num_correct")
SAMPLE_SORTS = ("prompt", "reward", "advantage", "v_star")
STATS_GROUPS = 4096
# A run's prompt row: the shared row's columns, in their order, with the run's own values in place of its.
_VALUE_ROW = tuple(getattr(RunValue, c.key) if c.key in RUN_OWN else c for c in PromptValue.__table__.columns)


def _page_columns(text_chars: int) -> tuple[Any, ...]:
    """A table's columns of a run's prompt row: no completions or rewards, the start of the prompt text only."""
    pv, rv = PromptValue, RunValue
    return (pv.id, rv.prompt_id, func.substr(pv.prompt_text, 1, text_chars).label("prompt_text"), pv.prompt,
            rv.v_star, rv.num_correct, rv.filtered)


def _distinct_in_index(column: Any, where: list[Any]) -> Any:
    """A query of the distinct values of `column` among the rows matching `where`, in order, by a loose index scan:
    each value is one seek for the smallest one above the last, on an index that leads with `where`'s columns and
    then `column` (a plain DISTINCT would read every matching row)."""
    found = select(func.min(column).label("value")).where(*where).cte("found", recursive=True)
    following = select(func.min(column)).where(*where, column > found.c.value).scalar_subquery()
    found = found.union_all(select(following).where(found.c.value.is_not(None)))
    return select(found.c.value).where(found.c.value.is_not(None)).order_by(found.c.value)


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


MAX_SEARCH_CHARS = 500  # a search box's text: SQLite refuses LIKE patterns past 50,000 bytes, and nobody types more


def _like_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with LIKE's wildcards in `text` taken literally; ValueError naming
    the limit for a text longer than `MAX_SEARCH_CHARS`."""
    if len(text) > MAX_SEARCH_CHARS:
        raise ValueError(f"The search text has {len(text):,} characters; search for at most {MAX_SEARCH_CHARS}.")
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _histogram_bins(lo: float | None, hi: float | None, bins: int) -> tuple[float, float, int]:
    """(start, width, count) of about `bins` bins with a round width (1, 2, 2.5 or 5 times a power of ten) that
    cover [lo, hi]; bin i holds start + i * width <= v < start + (i + 1) * width."""
    if lo is None or hi is None:
        return 0.0, 1.0, 0
    span = hi - lo
    raw = (span if span > 0 else max(abs(lo), 1.0)) / max(1, bins)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    width = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude * (1 + 1e-9))
    start = math.floor(lo / width) * width
    return start, width, int((hi - start) / width) + 1
