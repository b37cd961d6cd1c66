"""The columns of TRL's completion table a sample had besides its own (`samples.extra`, JSON): each reward
function's value, then what the reward functions logged with `log_extra` (`storage.export.completion_tables`).

A nullable column: the samples stored before it keep NULL (their table has only the weighted reward), and a studio
of before this revision never reads it and leaves it NULL in the rows it inserts, so SQLite's `user_version` stays
where it was. The downgrade drops the column, and refuses (changing nothing) while a sample has values in it, which
would be lost.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


class Irreversible(RuntimeError):
    """Undoing the revision would lose data; nothing was changed."""


def upgrade() -> None:
    op.add_column("samples", sa.Column("extra", sa.JSON(), nullable=True))


def downgrade() -> None:
    kept = op.get_bind().execute(sa.text("SELECT count(*) FROM samples WHERE extra IS NOT NULL")).scalar()
    if kept:
        raise Irreversible(
            f"Revision 0006 cannot be undone on this database: {kept} samples hold per-reward values or log_extra "
            "columns (samples.extra), which revision 0005's samples table cannot hold. Nothing was changed. To go "
            "back, restore the copy kept before the upgrade (studio.db.0005.bak beside a SQLite file; a dump of a "
            "server), or delete those runs first.")
    # In place on both dialects (SQLite 3.35+), as 0005's downgrade.
    op.execute("ALTER TABLE samples DROP COLUMN extra")
