"""What sampling a V* set cost (`value_sets.cost`, per split: seconds, completion tokens and the prompts they
sampled), so a run that reuses the set is charged its stage 1 and equal time stays equal.

A nullable column: a studio of before this revision never reads it and leaves it NULL in the sets it creates (its
cost is then unknown), so SQLite's `user_version` stays where it was. The upgrade fills it for the sets already
stored from what their runs logged: each run's own stage-1 cost per split (`values/<split>/runtime` and
`values/<split>/completion_tokens`, which a run that sampled nothing never logged), summed over the set's runs,
for the prompts the set holds; the runs deleted since took their share with them, so that is at least what the
set cost. The downgrade drops the column.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.add_column("value_sets", sa.Column("cost", sa.JSON(), nullable=True))
    conn = op.get_bind()
    spent: dict[int, dict[str, dict[str, float]]] = {}
    rows = conn.execute(sa.text(
        "SELECT r.value_set_id, m.name, m.value FROM metric_latest m JOIN runs r ON r.id = m.run_id "
        "WHERE r.value_set_id IS NOT NULL AND m.name LIKE :stage_one AND m.value IS NOT NULL"),
        {"stage_one": "values/%"})
    for value_set_id, name, value in rows:
        parts = name.split("/")
        if len(parts) != 3 or parts[2] not in ("runtime", "completion_tokens"):
            continue
        split = spent.setdefault(int(value_set_id), {}).setdefault(parts[1], {"seconds": 0.0, "tokens": 0.0})
        split["seconds" if parts[2] == "runtime" else "tokens"] += float(value)
    value_sets = sa.table("value_sets", sa.column("id", sa.Integer), sa.column("counts", sa.JSON),
                          sa.column("cost", sa.JSON))
    for value_set_id, counts in conn.execute(sa.select(value_sets.c.id, value_sets.c.counts)):
        cost = {split: {"seconds": round(paid["seconds"], 4), "tokens": int(paid["tokens"]),
                        "prompts": int((counts or {}).get(split) or 0)}
                for split, paid in spent.get(int(value_set_id), {}).items()
                if paid["seconds"] > 0 and (counts or {}).get(split)}
        if cost:
            conn.execute(value_sets.update().where(value_sets.c.id == value_set_id).values(cost=cost))


def downgrade() -> None:
    # In place on both dialects (SQLite 3.35+): a batch rebuild would lose the table's AUTOINCREMENT.
    op.execute("ALTER TABLE value_sets DROP COLUMN cost")
