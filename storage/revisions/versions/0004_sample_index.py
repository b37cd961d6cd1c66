"""GRPO samples G completions of a prompt per step: a sample's index within its prompt's group
(`samples.sample_index`, 0..G-1; A*-PO's one sample per prompt and step is index 0) joins the samples' unique key.

SQLite cannot change a table's UNIQUE constraint in place, so there the table is rebuilt, keeping its ids (the
pages page by them); PostgreSQL adds the column and swaps the constraint. The downgrade gives back revision 0003's
table, key included, and refuses (changing nothing) while a sample has an index above 0: the old key cannot hold a
GRPO group, so undoing the revision would lose samples.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

SQLITE_REBUILD = [
    """CREATE TABLE samples_new (
        id INTEGER NOT NULL,
        run_id INTEGER NOT NULL,
        step INTEGER NOT NULL,
        split VARCHAR(64) NOT NULL,
        prompt_id VARCHAR(200) NOT NULL,
        sample_index INTEGER NOT NULL DEFAULT 0,
        prompt_text TEXT NOT NULL,
        completion TEXT NOT NULL,
        reward FLOAT,
        v_star FLOAT,
        advantage FLOAT,
        implicit_reward FLOAT,
        completion_length FLOAT,
        created_at FLOAT NOT NULL,
        PRIMARY KEY (id),
        UNIQUE (run_id, split, step, prompt_id, sample_index),
        FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)""",
    """INSERT INTO samples_new (id, run_id, step, split, prompt_id, sample_index, prompt_text, completion, reward,
                                v_star, advantage, implicit_reward, completion_length, created_at)
       SELECT id, run_id, step, split, prompt_id, 0, prompt_text, completion, reward, v_star, advantage,
              implicit_reward, completion_length, created_at FROM samples""",
    "DROP TABLE samples",
    "ALTER TABLE samples_new RENAME TO samples",
    "CREATE INDEX ix_samples_run_id_id ON samples (run_id, id)",
]
OLD_KEY = ("run_id", "split", "step", "prompt_id")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for statement in SQLITE_REBUILD:
            op.execute(statement)
        return
    op.execute("ALTER TABLE samples ADD COLUMN sample_index INTEGER NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE samples DROP CONSTRAINT samples_run_id_split_step_prompt_id_key")  # PostgreSQL's name
    op.create_unique_constraint(None, "samples", [*OLD_KEY, "sample_index"])


SQLITE_RESTORE = [
    """CREATE TABLE samples_old (
        id INTEGER NOT NULL,
        run_id INTEGER NOT NULL,
        step INTEGER NOT NULL,
        split VARCHAR(64) NOT NULL,
        prompt_id VARCHAR(200) NOT NULL,
        prompt_text TEXT NOT NULL,
        completion TEXT NOT NULL,
        reward FLOAT,
        v_star FLOAT,
        advantage FLOAT,
        implicit_reward FLOAT,
        completion_length FLOAT,
        created_at FLOAT NOT NULL,
        PRIMARY KEY (id),
        UNIQUE (run_id, split, step, prompt_id),
        FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE)""",
    """INSERT INTO samples_old (id, run_id, step, split, prompt_id, prompt_text, completion, reward, v_star, advantage,
                                implicit_reward, completion_length, created_at)
       SELECT id, run_id, step, split, prompt_id, prompt_text, completion, reward, v_star, advantage,
              implicit_reward, completion_length, created_at FROM samples""",
    "DROP TABLE samples",
    "ALTER TABLE samples_old RENAME TO samples",
    "CREATE INDEX ix_samples_run_id_id ON samples (run_id, id)",
]


class Irreversible(RuntimeError):
    """Undoing the revision would lose data; nothing was changed."""


def downgrade() -> None:
    grouped = op.get_bind().execute(sa.text("SELECT count(*) FROM samples WHERE sample_index <> 0")).scalar()
    if grouped:
        raise Irreversible(
            f"Revision 0004 cannot be undone on this database: {grouped} samples belong to GRPO groups "
            "(sample_index above 0), which revision 0003's samples table cannot hold. Nothing was changed. To go "
            "back, restore the copy kept before the upgrade (studio.db.0003.bak beside a SQLite file; a dump of a "
            "server), or delete the GRPO runs first.")
    if op.get_bind().dialect.name == "sqlite":
        for statement in SQLITE_RESTORE:
            op.execute(statement)
        return
    op.drop_column("samples", "sample_index")  # PostgreSQL drops the key that holds the column with it
    op.create_unique_constraint("samples_run_id_split_step_prompt_id_key", "samples", list(OLD_KEY))
