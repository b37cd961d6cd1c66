"""Baseline: the studio schema of the last hand-written migration (schema 5 of `storage.migrations`).

An empty database of either dialect gets these tables; a SQLite file that the hand-written chain brought to
schema 5 already has them and is stamped here instead (`storage.migrations.ensure_schema`). Written out, not
generated from `storage.models`, which will move on: a later change is a new revision after this one.
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer, primary_key=True)


def _run_id(**kw) -> sa.Column:
    return sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, **kw)


def upgrade() -> None:
    # A table's parents before it (its foreign keys). Runs and value sets have AUTOINCREMENT ids on SQLite: a deleted
    # one's id is never given again (PostgreSQL's sequences never give one twice anyway).
    _value_tables()
    _runs()
    _run_records()
    _run_values_and_samples()


def _value_tables() -> None:
    """Value sets (stage 1's V* sets) and their prompts' values."""
    op.create_table(
        "value_sets", _id(),
        sa.Column("fingerprint", sa.String(128), nullable=False, unique=True),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("complete", sa.Boolean, nullable=False),
        sa.Column("summary", sa.JSON, nullable=True),
        sa.Column("counts", sa.JSON, nullable=False),
        sqlite_autoincrement=True)
    op.create_table(
        "prompt_values", _id(),
        sa.Column("value_set_id", sa.Integer, sa.ForeignKey("value_sets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("prompt_id", sa.String(200), nullable=False),
        sa.Column("prompt", sa.JSON, nullable=True),
        sa.Column("prompt_text", sa.Text, nullable=False),
        sa.Column("v_star", sa.Float, nullable=True),
        sa.Column("rewards", sa.JSON, nullable=False),
        sa.Column("completions", sa.JSON, nullable=False),
        sa.Column("num_correct", sa.Integer, nullable=True),
        sa.Column("filtered", sa.Boolean, nullable=False),
        sa.UniqueConstraint("value_set_id", "split", "prompt_id"))
    op.create_index("ix_prompt_values_stats", "prompt_values",
                    ["value_set_id", "split", "v_star", "num_correct", "filtered"])


def _runs() -> None:
    """The runs: a row each, with its spec, status, progress and the scheduler's and state machine's columns."""
    op.create_table(
        "runs", _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(16), nullable=True),
        sa.Column("progress", sa.Float, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("model", sa.String(500), nullable=False),
        sa.Column("dataset", sa.String(500), nullable=False),
        sa.Column("value_set_id", sa.Integer, sa.ForeignKey("value_sets.id", ondelete="SET NULL"), nullable=True),
        sa.Column("output_dir", sa.Text, nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("queued_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("heartbeat_at", sa.Float, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("best_eval_accuracy", sa.Float, nullable=True),
        sa.Column("parent_run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("stop_reason", sa.String(16), nullable=True),
        sa.Column("progress_at", sa.Float, nullable=True),
        sa.Column("num_devices", sa.Integer, nullable=False),
        sa.Column("devices", sa.String(64), nullable=True),
        sa.Column("owner", sa.String(200), nullable=True),
        sa.Column("auto_resumes", sa.Integer, nullable=False),
        sa.Column("launch_failures", sa.Integer, nullable=False),
        sa.Column("chunks_done", sa.Integer, nullable=False),
        sa.Column("chunk_seconds", sa.Float, nullable=False),
        sa.Column("limit_seconds", sa.Float, nullable=False),
        sa.Column("journal_offset", sa.Integer, nullable=False),
        sa.Column("value_counts", sa.JSON, nullable=False),
        sa.Column("values_revision", sa.Integer, nullable=False),
        sqlite_autoincrement=True)
    op.create_index("ix_runs_status", "runs", ["status"])


def _run_records() -> None:
    """What a run writes as it goes: checkpoints, evaluations, logs and metrics (and each metric's latest value)."""
    op.create_table(
        "checkpoints", _id(), _run_id(),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "path"))
    op.create_index("ix_checkpoints_run_id", "checkpoints", ["run_id"])
    op.create_table(
        "evaluations", _id(), _run_id(),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "step", "split"))
    op.create_index("ix_evaluations_run_id", "evaluations", ["run_id"])
    op.create_table(
        "logs", _id(), _run_id(),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False))
    op.create_index("ix_logs_run_id_id", "logs", ["run_id", "id"])
    op.create_table(
        "metric_latest", _run_id(primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("metric_id", sa.Integer, nullable=False))
    op.create_table(
        "metrics", _id(), _run_id(),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "step", "name"))
    op.create_index("ix_metrics_run_id_id", "metrics", ["run_id", "id"])
    op.create_index("ix_metrics_series", "metrics", ["run_id", "name", "step", "value"])


def _run_values_and_samples() -> None:
    """A run's own V* rows (copied from its value set) and its sampled completions."""
    op.create_table(
        "run_values", _id(), _run_id(),
        sa.Column("value_id", sa.Integer, sa.ForeignKey("prompt_values.id", ondelete="CASCADE"), nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("prompt_id", sa.String(200), nullable=False),
        sa.Column("v_star", sa.Float, nullable=True),
        sa.Column("num_correct", sa.Integer, nullable=True),
        sa.Column("filtered", sa.Boolean, nullable=False),
        sa.UniqueConstraint("run_id", "split", "prompt_id"))
    op.create_index("ix_run_values_stats", "run_values",
                    ["run_id", "split", "v_star", "num_correct", "filtered", "value_id"])
    op.create_index("ix_run_values_order", "run_values", ["run_id", "split", "value_id"])
    op.create_index("ix_run_values_value_id", "run_values", ["value_id"])
    op.create_table(
        "samples", _id(), _run_id(),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("split", sa.String(64), nullable=False),
        sa.Column("prompt_id", sa.String(200), nullable=False),
        sa.Column("prompt_text", sa.Text, nullable=False),
        sa.Column("completion", sa.Text, nullable=False),
        sa.Column("reward", sa.Float, nullable=True),
        sa.Column("v_star", sa.Float, nullable=True),
        sa.Column("advantage", sa.Float, nullable=True),
        sa.Column("implicit_reward", sa.Float, nullable=True),
        sa.Column("completion_length", sa.Float, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "split", "step", "prompt_id"))
    op.create_index("ix_samples_run_id_id", "samples", ["run_id", "id"])


def downgrade() -> None:
    for table in ("samples", "run_values", "metrics", "metric_latest", "logs", "evaluations", "checkpoints", "runs",
                  "prompt_values", "value_sets"):
        op.drop_table(table)
