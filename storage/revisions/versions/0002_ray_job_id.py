"""The Ray job that runs a run (`runs.ray_job_id`), so a restarted studio re-adopts jobs still running on the
cluster and the Logs tab finds a job's output (`app.runtime.ray_backend`).

A nullable column that only the Ray backend writes: a studio of before this revision (or of before Alembic) that
opens the file never reads it and leaves it NULL in the rows it inserts, so SQLite's `user_version` stays at 5.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("runs", sa.Column("ray_job_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("ray_job_id")
