"""`Store`: the one public entry point to the studio database (SQLite, via the SQLAlchemy 2 ORM).

Everything returned is a plain dict or list, so no ORM object (and no open session) leaks to callers.

Concurrency: the UI process, the scheduler and one worker process write to the same file at once. The database
runs in WAL mode (readers never block the writer), every connection waits up to `busy_timeout` for a lock, and
write transactions start with `BEGIN IMMEDIATE`: they take the write lock up front, so a transaction never has
to upgrade a read lock later, which in SQLite fails at once with "database is locked" instead of waiting.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, or_, select, update
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.orm import Session

from storage.models import (
    RUN_KINDS,
    RUN_STAGES,
    RUN_STATUSES,
    Base,
    Checkpoint,
    Evaluation,
    LogLine,
    Metric,
    PromptValue,
    Run,
    Sample,
    ValueSet,
)

BUSY_TIMEOUT_MS = 30_000
# A sample is correct when its reward is 1, as `a2po.values.CORRECT_THRESHOLD` counts it (storage does not import a2po).
CORRECT_REWARD = 1.0 - 1e-6
RUN_CHILD_TABLES = (Metric, Sample, Evaluation, Checkpoint, LogLine)
# Columns a caller may change with `update_run` (id and created_at are fixed once the run exists).
RUN_FIELDS = frozenset(c.key for c in Run.__table__.columns) - {"id", "created_at"}


def _make_engine(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy emit BEGIN itself (see `_on_begin`); the sqlite3 module's implicit BEGIN is deferred.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")  # safe in WAL mode, and much faster than FULL
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('sqlite_begin', 'DEFERRED')}")

    return engine


def _now() -> float:
    return time.time()


def _float(value: Any) -> float | None:
    """A finite float, or None for missing / NaN values (SQLite stores NaN as NULL anyway)."""
    if value is None or isinstance(value, str):
        return None
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _is_number(value: Any) -> bool:
    """True for ints, floats and one-element numpy / torch values; bools and strings are not metrics."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError, RuntimeError):
            return False
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _prompt_text(prompt: Any) -> str:
    """Readable text of a prompt given either as a string or as a list of chat messages."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, Mapping) else str(m) for m in prompt)
    return "" if prompt is None else str(prompt)


def _json_safe(value: Any) -> Any:
    """Recursively turn floats that JSON cannot hold (NaN, inf) into None and scalars into plain Python."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Store:
    """Read and write runs, V* sets, metrics, samples, evaluations, checkpoints and logs in one SQLite file.

    Safe to share between threads; safe across `fork` (a child process opens its own connections).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._writer: Engine | None = None
        self._pid = -1
        with self._lock:
            Base.metadata.create_all(self._engines()[1])  # under BEGIN IMMEDIATE: two processes may start at once

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # ------------------------------------------------------------------ plumbing

    def _engines(self) -> tuple[Engine, Engine]:
        """(reader, writer) engines of this process; a forked child must not reuse its parent's connections."""
        if self._pid != os.getpid():
            if self._engine is not None:
                self._engine.dispose(close=False)  # drop the parent's pooled connections without closing them
            self._engine = _make_engine(self.path)
            self._writer = self._engine.execution_options(sqlite_begin="IMMEDIATE")
            self._pid = os.getpid()
        return self._engine, self._writer

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._lock:
            engine = self._engines()[0]
        with Session(engine) as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._lock:
            engine = self._engines()[1]
        with Session(engine) as session, session.begin():
            yield session

    def close(self) -> None:
        """Close this process's connections (a later call reopens them)."""
        with self._lock:
            if self._engine is not None and self._pid == os.getpid():
                self._engine.dispose()
            self._engine = self._writer = None
            self._pid = -1

    @staticmethod
    def _rows(session: Session, stmt) -> list[dict[str, Any]]:
        return [dict(row) for row in session.execute(stmt).mappings()]

    # ------------------------------------------------------------------ runs

    def create_run(self, name: str, kind: str, spec: dict[str, Any], model: str = "", dataset: str = "",
                   parent_run_id: int | None = None) -> int:
        """Add a queued run; `spec` (the whole run spec) is stored as its config. Returns the new run id."""
        if kind not in RUN_KINDS:
            raise ValueError(f"Unknown run kind {kind!r}: use one of {', '.join(RUN_KINDS)}.")
        now = _now()
        with self._write() as s:
            run = Run(name=name, kind=kind, status="queued", config=_json_safe(spec), model=model, dataset=dataset,
                      created_at=now, queued_at=now, parent_run_id=parent_run_id, progress=0.0)
            s.add(run)
            s.flush()
            return run.id

    def get_run(self, run_id: int) -> dict[str, Any] | None:
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

    @staticmethod
    def _check_run_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(fields) - RUN_FIELDS
        if unknown:
            raise ValueError(f"Unknown run field(s) {sorted(unknown)}: use {sorted(RUN_FIELDS)}.")
        if "status" in fields and fields["status"] not in RUN_STATUSES:
            raise ValueError(f"Unknown run status {fields['status']!r}: use one of {', '.join(RUN_STATUSES)}.")
        if fields.get("stage") is not None and fields["stage"] not in RUN_STAGES:
            raise ValueError(f"Unknown run stage {fields['stage']!r}: use one of {', '.join(RUN_STAGES)} or None.")
        if "kind" in fields and fields["kind"] not in RUN_KINDS:
            raise ValueError(f"Unknown run kind {fields['kind']!r}: use one of {', '.join(RUN_KINDS)}.")
        return {k: _json_safe(v) if k == "config" else v for k, v in fields.items()}

    def update_run(self, run_id: int, **fields: Any) -> bool:
        """Set columns of a run (e.g. `status="finished", progress=1.0`). Returns False if the run is gone."""
        if not fields:
            return self.get_run(run_id) is not None
        values = self._check_run_fields(fields)
        with self._write() as s:
            return s.execute(update(Run).where(Run.id == run_id).values(**values)).rowcount == 1

    def transition(self, run_id: int, from_status: str | Iterable[str], **fields: Any) -> bool:
        """Atomically update a run only while its status is `from_status` (one or several); True if it did."""
        allowed = [from_status] if isinstance(from_status, str) else list(from_status)
        values = self._check_run_fields(fields)
        with self._write() as s:
            stmt = update(Run).where(Run.id == run_id, Run.status.in_(allowed)).values(**values)
            return s.execute(stmt).rowcount == 1

    def heartbeat(self, run_id: int, **fields: Any) -> None:
        """Mark the run's worker alive now (optionally updating other columns, e.g. progress, in the same write)."""
        self.update_run(run_id, heartbeat_at=_now(), **fields)

    def next_queued_run(self) -> dict[str, Any] | None:
        """The queued run that has waited longest, or None."""
        stmt = (select(Run.__table__).where(Run.status == "queued")
                .order_by(Run.queued_at, Run.id).limit(1))
        with self._read() as s:
            rows = self._rows(s, stmt)
        return rows[0] if rows else None

    def claim_run(self, run_id: int, pid: int) -> bool:
        """Atomically move a run from queued to running for process `pid`; False if it was not queued anymore."""
        now = _now()
        return self.transition(run_id, "queued", status="running", pid=pid, started_at=now, heartbeat_at=now,
                               finished_at=None, error=None)

    def requeue_run(self, run_id: int, from_status: str | Iterable[str] = ("stopped", "failed")) -> bool:
        """Put a stopped/failed run back at the end of the queue (to resume it); False if it was not in them."""
        return self.transition(run_id, from_status, status="queued", queued_at=_now(), pid=None, error=None,
                               finished_at=None)

    def delete_run(self, run_id: int) -> bool:
        """Remove a run and all its rows (metrics, samples, evaluations, checkpoints, logs); value sets stay."""
        with self._write() as s:
            # Explicit deletes: correct even on a database file opened elsewhere without foreign keys on.
            for table in RUN_CHILD_TABLES:
                s.execute(delete(table).where(table.run_id == run_id))
            s.execute(update(Run).where(Run.parent_run_id == run_id).values(parent_run_id=None))
            return s.execute(delete(Run).where(Run.id == run_id)).rowcount == 1

    # ------------------------------------------------------------------ value sets

    def get_or_create_value_set(self, fingerprint: str, meta: dict[str, Any]) -> int:
        """The id of the value set with this fingerprint, created (incomplete, empty) if there is none."""
        with self._write() as s:
            s.execute(insert(ValueSet).values(fingerprint=fingerprint, meta=_json_safe(meta), created_at=_now(),
                                              complete=False).on_conflict_do_nothing(index_elements=["fingerprint"]))
            return s.scalar(select(ValueSet.id).where(ValueSet.fingerprint == fingerprint))

    def _value_sets(self, where=None) -> list[dict[str, Any]]:
        counts = (select(PromptValue.value_set_id, func.count().label("num_values"))
                  .group_by(PromptValue.value_set_id).subquery())
        stmt = (select(ValueSet.__table__, func.coalesce(counts.c.num_values, 0).label("num_values"))
                .outerjoin(counts, counts.c.value_set_id == ValueSet.id).order_by(ValueSet.id.desc()))
        if where is not None:
            stmt = stmt.where(where)
        with self._read() as s:
            return self._rows(s, stmt)

    def find_value_set(self, fingerprint: str) -> dict[str, Any] | None:
        rows = self._value_sets(ValueSet.fingerprint == fingerprint)
        return rows[0] if rows else None

    def get_value_set(self, value_set_id: int) -> dict[str, Any] | None:
        rows = self._value_sets(ValueSet.id == value_set_id)
        return rows[0] if rows else None

    def list_value_sets(self) -> list[dict[str, Any]]:
        """All value sets, newest first, each with `num_values` (stored prompt rows over all splits)."""
        return self._value_sets()

    def mark_value_set_complete(self, value_set_id: int, summary: dict[str, Any] | None = None) -> None:
        with self._write() as s:
            s.execute(update(ValueSet).where(ValueSet.id == value_set_id)
                      .values(complete=True, summary=_json_safe(summary or {})))

    def update_value_set_summary(self, value_set_id: int, summary: dict[str, Any]) -> None:
        """Merge `summary` into the stored summary (e.g. one split's stats) without marking the set complete."""
        with self._write() as s:
            current = s.scalar(select(ValueSet.summary).where(ValueSet.id == value_set_id)) or {}
            s.execute(update(ValueSet).where(ValueSet.id == value_set_id)
                      .values(summary={**current, **_json_safe(summary)}))

    def delete_value_set(self, value_set_id: int) -> bool:
        """Remove a value set and its prompt values; runs that used it keep their own rows."""
        with self._write() as s:
            s.execute(delete(PromptValue).where(PromptValue.value_set_id == value_set_id))
            s.execute(update(Run).where(Run.value_set_id == value_set_id).values(value_set_id=None))
            return s.execute(delete(ValueSet).where(ValueSet.id == value_set_id)).rowcount == 1

    # ------------------------------------------------------------------ prompt values

    def add_values(self, value_set_id: int, split: str, records: Iterable[Mapping[str, Any]]) -> int:
        """Store stage-1 records (as delivered by `on_values_batch`).

        Re-adding a stored prompt_id keeps the stored row (unless its V* was missing), so nothing is duplicated.
        Returns how many prompts were new to this value set and split.
        """
        rows = []
        for r in records:
            if r.get("prompt_id") is None:
                raise ValueError("A value record has no 'prompt_id': every stage-1 record needs one.")
            prompt = r.get("prompt")
            rows.append({
                "value_set_id": value_set_id, "split": split, "prompt_id": str(r["prompt_id"]),
                "prompt": _json_safe(prompt), "prompt_text": r.get("prompt_text") or _prompt_text(prompt),
                "v_star": _float(r.get("v_star")), "rewards": _json_safe(list(r.get("rewards") or [])),
                "completions": [str(c) for c in r.get("completions") or []],
                "num_correct": None if r.get("num_correct") is None else int(r["num_correct"]),  # None: V* was given
                "filtered": bool(r.get("filtered", False)),
            })
        if not rows:
            return 0
        stmt = insert(PromptValue)
        keep = ("prompt", "prompt_text", "v_star", "rewards", "completions", "num_correct", "filtered")
        # A stored estimate is never overwritten (same fingerprint = same settings, so it is as good as a new one);
        # only a row whose V* is still missing takes the new values.
        stmt = stmt.on_conflict_do_update(index_elements=["value_set_id", "split", "prompt_id"],
                                          set_={k: stmt.excluded[k] for k in keep},
                                          where=PromptValue.v_star.is_(None))
        where = (PromptValue.value_set_id == value_set_id, PromptValue.split == split)
        with self._write() as s:
            before = s.scalar(select(func.count()).select_from(PromptValue).where(*where))
            s.execute(stmt, rows)
            return s.scalar(select(func.count()).select_from(PromptValue).where(*where)) - before

    def get_values(self, value_set_id: int, split: str | None = "train") -> list[dict[str, Any]]:
        """Stored prompt values of one split (all splits with `split=None`), in insertion order."""
        stmt = select(PromptValue.__table__).where(PromptValue.value_set_id == value_set_id).order_by(PromptValue.id)
        if split is not None:
            stmt = stmt.where(PromptValue.split == split)
        with self._read() as s:
            return self._rows(s, stmt)

    def count_values(self, value_set_id: int, split: str | None = "train") -> int:
        stmt = select(func.count()).select_from(PromptValue).where(PromptValue.value_set_id == value_set_id)
        if split is not None:
            stmt = stmt.where(PromptValue.split == split)
        with self._read() as s:
            return s.scalar(stmt)

    def value_prompt_ids(self, value_set_id: int, split: str = "train") -> set[str]:
        stmt = select(PromptValue.prompt_id).where(PromptValue.value_set_id == value_set_id,
                                                   PromptValue.split == split)
        with self._read() as s:
            return set(s.scalars(stmt))

    def value_splits(self, value_set_id: int) -> list[str]:
        stmt = select(PromptValue.split).where(PromptValue.value_set_id == value_set_id).distinct()
        with self._read() as s:
            return sorted(s.scalars(stmt))

    # ------------------------------------------------------------------ metrics

    def add_metrics(self, run_id: int, step: int, metrics: Mapping[str, Any]) -> int:
        """Upsert one value per metric name at `step`; non-numeric values are skipped. Returns how many were kept."""
        now = _now()
        rows = [{"run_id": run_id, "step": int(step), "name": str(name), "value": _float(value), "created_at": now}
                for name, value in metrics.items() if _is_number(value)]
        if not rows:
            return 0
        stmt = insert(Metric)
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "name"],
                                          set_={"value": stmt.excluded.value})
        with self._write() as s:
            s.execute(stmt, rows)
        return len(rows)

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
            return sorted(s.scalars(select(Metric.name).where(Metric.run_id == run_id).distinct()))

    def max_metric_id(self, run_id: int) -> int:
        """Largest metric row id of the run (0 if none): a cheap "did anything change" check for pollers."""
        with self._read() as s:
            return s.scalar(select(func.coalesce(func.max(Metric.id), 0)).where(Metric.run_id == run_id))

    def last_ids(self, run_id: int) -> dict[str, int]:
        """Largest row id per table (metrics, samples, logs, evaluations, checkpoints) for one run, in one read."""
        names = {"metrics": Metric, "samples": Sample, "logs": LogLine, "evaluations": Evaluation,
                 "checkpoints": Checkpoint}
        stmt = select(*[select(func.coalesce(func.max(t.id), 0)).where(t.run_id == run_id).scalar_subquery()
                        .label(name) for name, t in names.items()])
        with self._read() as s:
            return dict(s.execute(stmt).mappings().one())

    # ------------------------------------------------------------------ samples

    def add_samples(self, run_id: int, samples: Iterable[Mapping[str, Any]]) -> int:
        """Store stage-2 samples (as delivered by `on_samples`); one row per (split, step, prompt_id), latest wins."""
        now = _now()
        rows = [{
            "run_id": run_id, "step": int(x.get("step") or 0), "split": str(x.get("split") or "train"),
            "prompt_id": str(x.get("prompt_id", "")), "prompt_text": str(x.get("prompt_text") or ""),
            "completion": str(x.get("completion") or ""), "reward": _float(x.get("reward")),
            "v_star": _float(x.get("v_star")), "advantage": _float(x.get("advantage")),
            "implicit_reward": _float(x.get("implicit_reward")),
            "completion_length": _float(x.get("completion_length")), "created_at": now,
        } for x in samples]
        if not rows:
            return 0
        stmt = insert(Sample)
        keep = ("prompt_text", "completion", "reward", "v_star", "advantage", "implicit_reward", "completion_length")
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "split", "step", "prompt_id"],
                                          set_={k: stmt.excluded[k] for k in keep})
        with self._write() as s:
            s.execute(stmt, rows)
        return len(rows)

    def get_samples(self, run_id: int, after_id: int = 0, correct: bool | None = None, text: str | None = None,
                    step: int | None = None, split: str | None = None, limit: int | None = 500,
                    newest_first: bool = False) -> list[dict[str, Any]]:
        """Samples of a run with id > `after_id`, oldest first (or newest first), at most `limit` rows.

        `correct` keeps rewards >= CORRECT_REWARD (True) or below (False); `text` is a case-insensitive substring
        of the prompt or the completion.
        """
        stmt = select(Sample.__table__).where(Sample.run_id == run_id, Sample.id > after_id)
        if correct is not None:
            stmt = stmt.where(Sample.reward >= CORRECT_REWARD if correct
                              else or_(Sample.reward < CORRECT_REWARD, Sample.reward.is_(None)))
        if text:
            pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            stmt = stmt.where(or_(Sample.prompt_text.ilike(pattern, escape="\\"),
                                  Sample.completion.ilike(pattern, escape="\\")))
        if step is not None:
            stmt = stmt.where(Sample.step == step)
        if split is not None:
            stmt = stmt.where(Sample.split == split)
        stmt = stmt.order_by(Sample.id.desc() if newest_first else Sample.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return self._rows(s, stmt)

    # ------------------------------------------------------------------ evaluations

    def add_evaluation(self, run_id: int, step: int, metrics: Mapping[str, Any], split: str = "eval") -> None:
        """Store one evaluation (one row per step and split) and keep the run's `best_eval_accuracy` up to date."""
        clean = _json_safe(dict(metrics))
        stmt = insert(Evaluation).values(run_id=run_id, step=int(step), split=split, metrics=clean, created_at=_now())
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "step", "split"],
                                          set_={"metrics": stmt.excluded.metrics})
        accuracy = _float(clean.get(f"{split}_accuracy", clean.get("accuracy")))
        with self._write() as s:
            s.execute(stmt)
            if accuracy is not None:
                best = func.max(func.coalesce(Run.best_eval_accuracy, accuracy), accuracy)
                s.execute(update(Run).where(Run.id == run_id).values(best_eval_accuracy=best))

    def get_evaluations(self, run_id: int) -> list[dict[str, Any]]:
        stmt = select(Evaluation.__table__).where(Evaluation.run_id == run_id).order_by(Evaluation.step,
                                                                                        Evaluation.id)
        with self._read() as s:
            return self._rows(s, stmt)

    # ------------------------------------------------------------------ checkpoints

    def add_checkpoint(self, run_id: int, step: int, path: str | os.PathLike[str]) -> None:
        stmt = insert(Checkpoint).values(run_id=run_id, step=int(step), path=str(path), created_at=_now())
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "path"],
                                          set_={"step": stmt.excluded.step, "created_at": stmt.excluded.created_at})
        with self._write() as s:
            s.execute(stmt)

    def list_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        stmt = select(Checkpoint.__table__).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step,
                                                                                        Checkpoint.id)
        with self._read() as s:
            return self._rows(s, stmt)

    def latest_checkpoint(self, run_id: int) -> dict[str, Any] | None:
        """The checkpoint with the highest step (the newest among equals), or None."""
        rows = self.list_checkpoints(run_id)
        return max(rows, key=lambda r: (r["step"], r["id"])) if rows else None

    # ------------------------------------------------------------------ logs

    def add_log(self, run_id: int, message: str, level: str = "INFO") -> None:
        self.add_logs(run_id, [(level, message)])

    def add_logs(self, run_id: int, lines: Iterable[tuple[str, str]]) -> None:
        """Append several `(level, message)` lines in one transaction."""
        now = _now()
        rows = [{"run_id": run_id, "created_at": now, "level": str(level).upper(), "message": str(message)}
                for level, message in lines]
        if rows:
            with self._write() as s:
                s.execute(insert(LogLine), rows)

    def get_logs(self, run_id: int, after_id: int = 0, limit: int | None = 1000) -> list[dict[str, Any]]:
        """Log lines with id > `after_id`, oldest first."""
        stmt = (select(LogLine.__table__).where(LogLine.run_id == run_id, LogLine.id > after_id)
                .order_by(LogLine.id))
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._read() as s:
            return self._rows(s, stmt)
