"""Column names that say what they hold: `runs.kind` is the spec's action (`a2po.names.ACTIONS`), now
`runs.action`; `runs.num_devices` is the run's process count (a GPU each, or the CPU), now `runs.num_processes`.

The API keeps its field name `kind` (`app.web.api.API_NAMES`; it never showed `num_devices`). A studio of before
Alembic would query the old names, so SQLite files at this revision say `user_version` 6
(`storage.migrations.USER_VERSION`), which such a studio refuses.
"""

from alembic import op

revision = "0003"
down_revision = "0002"

RENAMES = (("kind", "action"), ("num_devices", "num_processes"))


def upgrade() -> None:
    for old, new in RENAMES:
        op.execute(f"ALTER TABLE runs RENAME COLUMN {old} TO {new}")


def downgrade() -> None:
    for old, new in RENAMES:
        op.execute(f"ALTER TABLE runs RENAME COLUMN {new} TO {old}")
