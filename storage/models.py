"""ORM tables of the studio database. Only `storage` imports this module; `Store` turns rows into plain dicts.

Timestamps are Unix epoch seconds (floats): cheap to compare for staleness checks and easy to format in the UI.
Child rows reference their run with ON DELETE CASCADE; value sets are shared between runs and outlive them. A
value set holds each prompt's reference samples once (`prompt_values`); what each run trained with, its own V* and
kept/filtered split recomputed from those samples with its beta1, is a narrow row per prompt of `run_values`.
Run and value-set ids are AUTOINCREMENT: an id once used is never given to another run, so nothing that still
names a deleted run (a bookmark, an export file, a log) can point at a new one.

The schema has a version (an Alembic revision; before those, SQLite's `user_version`); `storage.migrations` brings
older databases up to date. A change to these classes needs a new revision in `storage/revisions/versions` (a test
checks that the revisions give exactly these tables, on SQLite and on PostgreSQL).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def _run_fk() -> ForeignKey:
    return ForeignKey("runs.id", ondelete="CASCADE")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class ValueSet(Base):
    """A table of V* estimates for one (model, dataset, rewards, sampling settings, seed) combination."""

    __tablename__ = "value_sets"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(128), unique=True)
    meta: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    complete: Mapped[bool] = mapped_column(Boolean, default=False)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Stored prompts per split ({"train": 128, "eval": 32}), kept up to date by each write: polls never count rows.
    counts: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # What sampling the stored prompts cost, per split ({"train": {"seconds", "tokens", "prompts"}}), added by each
    # write of new prompts: a run that reuses them is charged their share (equal time counts stage 1). None: not
    # known (sampled before it was recorded, by runs since deleted).
    cost: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(16))  # the spec's: `a2po.names.ACTIONS`
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # `storage.lifecycle`
    stage: Mapped[str | None] = mapped_column(String(16), nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    model: Mapped[str] = mapped_column(String(500), default="")
    dataset: Mapped[str] = mapped_column(String(500), default="")
    value_set_id: Mapped[int | None] = mapped_column(ForeignKey("value_sets.id", ondelete="SET NULL"), nullable=True)
    output_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The Ray job of its latest start when the studio runs on a cluster (`app.runtime.ray_backend`), else None.
    ray_job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    # When the run last entered the queue (creation or resume): the scheduler serves runs in this order.
    queued_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    best_eval_accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    parent_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), nullable=True)
    stop_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)  # one of lifecycle.STOP_REASONS
    # Last real progress (a stage-1 batch, a training step, an evaluation, a checkpoint), unlike `heartbeat_at`,
    # which a live process keeps writing even when its main thread is stuck: the watchdog reads this one.
    progress_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The run's processes: a GPU each, or on a CPU-only machine the machine for all of them.
    num_processes: Mapped[int] = mapped_column(Integer, default=1)
    devices: Mapped[str | None] = mapped_column(String(64), nullable=True)  # assigned while running: "0,1" or "cpu"
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)  # who launched it (None: anonymous)
    # The counters of the run state machine: what each means is defined in `storage.lifecycle`.
    auto_resumes: Mapped[int] = mapped_column(Integer, default=0)
    launch_failures: Mapped[int] = mapped_column(Integer, default=0)
    chunks_done: Mapped[int] = mapped_column(Integer, default=0)
    chunk_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    limit_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # How far the parent has applied the journal of the run's chunk process (`Store.apply_journal`), in bytes.
    journal_offset: Mapped[int] = mapped_column(Integer, default=0)
    # The run's own V* rows (`run_values`) per split ({"train": 128, "eval": 32}), and a revision that moves with
    # each write that changed or removed one, or added one before the last (stage-1 order): what a page following
    # only the new rows would miss. Kept by `Store.set_run_values`, so polls never count rows.
    value_counts: Mapped[dict[str, Any]] = mapped_column(default=dict)
    values_revision: Mapped[int] = mapped_column(Integer, default=0)


class PromptValue(Base):
    """Stage-1 result for one prompt: the sampled completions and their rewards, shared by every run of the value
    set. Its `v_star`, `num_correct` and `filtered` are those of the run that sampled it first; what each run shows
    is its own `RunValue` row."""

    __tablename__ = "prompt_values"
    # The second index covers the V* histogram, the correct-count bars and the summary: they are computed from the
    # index alone, never reading the wide rows (N completions each).
    __table_args__ = (UniqueConstraint("value_set_id", "split", "prompt_id"),
                      Index("ix_prompt_values_stats", "value_set_id", "split", "v_star", "num_correct", "filtered"))

    id: Mapped[int] = mapped_column(primary_key=True)
    value_set_id: Mapped[int] = mapped_column(ForeignKey("value_sets.id", ondelete="CASCADE"))
    split: Mapped[str] = mapped_column(String(64))
    prompt_id: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[Any] = mapped_column(JSON, nullable=True)
    prompt_text: Mapped[str] = mapped_column(Text, default="")
    v_star: Mapped[float | None] = mapped_column(Float, nullable=True)
    rewards: Mapped[list[Any]] = mapped_column(default=list)
    completions: Mapped[list[Any]] = mapped_column(default=list)
    num_correct: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: V* was given, not sampled
    filtered: Mapped[bool] = mapped_column(Boolean, default=False)


class RunValue(Base):
    """What one run trained with for one prompt: its V* (from the shared reference rewards, with the run's beta1),
    the correct count and whether the run dropped the prompt. The text, rewards and completions stay in the shared
    `prompt_values` row (`value_id`), stored once for every run of the same value set."""

    __tablename__ = "run_values"
    # The stats index covers the V* histogram, the correct-count bars, the summary and the pages sorted by V* or by
    # correct count (with `value_id`, what the page then reads from `prompt_values`); the order index is the
    # stage-1 order (the shared rows' ids) and what a poller asks for since it last looked.
    __table_args__ = (UniqueConstraint("run_id", "split", "prompt_id"),
                      Index("ix_run_values_stats", "run_id", "split", "v_star", "num_correct", "filtered", "value_id"),
                      Index("ix_run_values_order", "run_id", "split", "value_id"),
                      Index("ix_run_values_value_id", "value_id"))  # deleting shared rows finds their run rows

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(_run_fk())
    value_id: Mapped[int] = mapped_column(ForeignKey("prompt_values.id", ondelete="CASCADE"))
    split: Mapped[str] = mapped_column(String(64))
    prompt_id: Mapped[str] = mapped_column(String(200))
    v_star: Mapped[float | None] = mapped_column(Float, nullable=True)
    num_correct: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: V* was given, not sampled
    filtered: Mapped[bool] = mapped_column(Boolean, default=False)


class Metric(Base):
    """One scalar at one step (long format, so new metric names need no schema change)."""

    __tablename__ = "metrics"
    # The series index covers a metric's curve (Store.metric_series reads it without touching the rows).
    __table_args__ = (UniqueConstraint("run_id", "step", "name"), Index("ix_metrics_run_id_id", "run_id", "id"),
                      Index("ix_metrics_series", "run_id", "name", "step", "value"))

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(_run_fk())
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # NULL: NaN (SQLite cannot store NaN)
    created_at: Mapped[float] = mapped_column(Float)


class LatestMetric(Base):
    """The newest value of each metric of a run (highest step), kept by every metric write: `/status` and the
    Runs page read one row per name instead of scanning the run's whole history."""

    __tablename__ = "metric_latest"

    run_id: Mapped[int] = mapped_column(_run_fk(), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    metric_id: Mapped[int] = mapped_column(Integer)


class Sample(Base):
    __tablename__ = "samples"
    # One row per completion: A*-PO's one per prompt and step (index 0), GRPO's G (`sample_index` 0..G-1).
    __table_args__ = (UniqueConstraint("run_id", "split", "step", "prompt_id", "sample_index"),
                      Index("ix_samples_run_id_id", "run_id", "id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(_run_fk())
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(64), default="train")
    prompt_id: Mapped[str] = mapped_column(String(200))
    sample_index: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    prompt_text: Mapped[str] = mapped_column(Text, default="")
    completion: Mapped[str] = mapped_column(Text, default="")
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    v_star: Mapped[float | None] = mapped_column(Float, nullable=True)
    advantage: Mapped[float | None] = mapped_column(Float, nullable=True)
    implicit_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    completion_length: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Each reward function's value, then the reward functions' `log_extra` columns: the columns of TRL's completion
    # table between the completion and the advantage (`storage.export.completion_tables`).
    extra: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class Evaluation(Base):
    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("run_id", "step", "split"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(_run_fk(), index=True)
    step: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(String(64), default="eval")
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(_run_fk(), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class LogLine(Base):
    __tablename__ = "logs"
    __table_args__ = (Index("ix_logs_run_id_id", "run_id", "id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(_run_fk())
    created_at: Mapped[float] = mapped_column(Float)
    level: Mapped[str] = mapped_column(String(16), default="INFO")
    message: Mapped[str] = mapped_column(Text)
