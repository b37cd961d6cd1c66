"""Schema versions of the studio database: Alembic revisions for both dialects (`storage/revisions/`, applied by
`ensure_schema`), and the hand-written chain (`upgrade`, steps `_v1`..`_v5`) that brings a SQLite file of before
Alembic up to where the revisions take over. `Store()` runs both on open. Versions, locks, backups and how to write
a step: docs/migrations.md.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Connection

from a2po.answers import CORRECT_THRESHOLD
from storage.secrets import scrub_secrets

LATEST = 5
HEAD = "0006"  # the newest Alembic revision (storage/revisions/versions); a test checks they agree
# What SQLite's header says of a file at `HEAD`: above `LATEST` once a revision renamed or dropped a column, so a
# studio of before Alembic (which knows versions up to 5) refuses the file; a revision that does so raises it.
USER_VERSION = 6
BASELINE = "0001"  # the revision whose schema is the chain's `LATEST`
REVISIONS = Path(__file__).parent / "revisions"
BUSY_TIMEOUT_S = 30.0

logger = logging.getLogger("storage.migrations")


class SchemaTooNew(RuntimeError):
    """The database was written by a newer version of the studio."""


class NotAStudio(RuntimeError):
    """The database holds tables of the studio's names but no version this studio can place."""


def _script(con: sqlite3.Connection, sql: str) -> None:
    """Run `;`-separated statements inside the current transaction (`executescript` would commit it first)."""
    for statement in sql.split(";"):
        if statement.strip():
            con.execute(statement)


def _v1(con: sqlite3.Connection) -> None:
    """AUTOINCREMENT ids for runs and value sets (ids are never reused); run columns for the scheduler
    (devices, stop reason, progress time, owner, resume and launch counters); per-split prompt counts on value
    sets; the latest value of each metric; a covering index for the V* statistics; secrets scrubbed from specs."""
    _drop_orphans(con)
    _runs_v1(con)
    _value_sets_v1(con)
    _metric_latest_v1(con)
    _scrub_specs(con)


def _drop_orphans(con: sqlite3.Connection) -> None:
    """Delete the leftovers of deleted runs and value sets: unreachable rows would fail the foreign-key check of the
    tables `_v1` copies."""
    _script(con, """
        DELETE FROM metrics WHERE run_id NOT IN (SELECT id FROM runs);
        DELETE FROM samples WHERE run_id NOT IN (SELECT id FROM runs);
        DELETE FROM evaluations WHERE run_id NOT IN (SELECT id FROM runs);
        DELETE FROM checkpoints WHERE run_id NOT IN (SELECT id FROM runs);
        DELETE FROM logs WHERE run_id NOT IN (SELECT id FROM runs);
        DELETE FROM prompt_values WHERE value_set_id NOT IN (SELECT id FROM value_sets);
        UPDATE runs SET value_set_id = NULL WHERE value_set_id NOT IN (SELECT id FROM value_sets);
        UPDATE runs SET parent_run_id = NULL WHERE parent_run_id NOT IN (SELECT id FROM runs);
    """)


def _runs_v1(con: sqlite3.Connection) -> None:
    """The runs table again, with AUTOINCREMENT ids and the scheduler's columns."""
    _script(con, """
        CREATE TABLE runs_v1 (
            id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
            name VARCHAR(200) NOT NULL,
            kind VARCHAR(16) NOT NULL,
            status VARCHAR(16) NOT NULL,
            stage VARCHAR(16),
            progress FLOAT NOT NULL,
            config JSON NOT NULL,
            model VARCHAR(500) NOT NULL,
            dataset VARCHAR(500) NOT NULL,
            value_set_id INTEGER,
            output_dir TEXT,
            pid INTEGER,
            created_at FLOAT NOT NULL,
            queued_at FLOAT NOT NULL,
            started_at FLOAT,
            finished_at FLOAT,
            heartbeat_at FLOAT,
            error TEXT,
            best_eval_accuracy FLOAT,
            parent_run_id INTEGER,
            stop_reason VARCHAR(16),
            progress_at FLOAT,
            num_devices INTEGER NOT NULL,
            devices VARCHAR(64),
            owner VARCHAR(200),
            auto_resumes INTEGER NOT NULL,
            launch_failures INTEGER NOT NULL,
            FOREIGN KEY(value_set_id) REFERENCES value_sets (id) ON DELETE SET NULL,
            FOREIGN KEY(parent_run_id) REFERENCES runs (id) ON DELETE SET NULL
        );
        INSERT INTO runs_v1 (id, name, kind, status, stage, progress, config, model, dataset, value_set_id,
                             output_dir, pid, created_at, queued_at, started_at, finished_at, heartbeat_at, error,
                             best_eval_accuracy, parent_run_id, num_devices, auto_resumes, launch_failures)
            SELECT id, name, kind, status, stage, progress, config, model, dataset, value_set_id, output_dir, pid,
                   created_at, queued_at, started_at, finished_at, heartbeat_at, error, best_eval_accuracy,
                   parent_run_id, 1, 0, 0
            FROM runs ORDER BY id;
        DROP TABLE runs;
        ALTER TABLE runs_v1 RENAME TO runs;
        CREATE INDEX ix_runs_status ON runs (status);
    """)


def _value_sets_v1(con: sqlite3.Connection) -> None:
    """The value sets again, with AUTOINCREMENT ids and their per-split prompt counts; the V* statistics' index."""
    _script(con, """
        CREATE TABLE value_sets_v1 (
            id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
            fingerprint VARCHAR(128) NOT NULL,
            meta JSON NOT NULL,
            created_at FLOAT NOT NULL,
            complete BOOLEAN NOT NULL,
            summary JSON,
            counts JSON NOT NULL,
            UNIQUE (fingerprint)
        );
        INSERT INTO value_sets_v1 (id, fingerprint, meta, created_at, complete, summary, counts)
            SELECT v.id, v.fingerprint, v.meta, v.created_at, v.complete, v.summary,
                   coalesce((SELECT json_group_object(split, n) FROM
                               (SELECT split, count(*) AS n FROM prompt_values p
                                WHERE p.value_set_id = v.id GROUP BY split)), '{}')
            FROM value_sets v ORDER BY v.id;
        DROP TABLE value_sets;
        ALTER TABLE value_sets_v1 RENAME TO value_sets;

        CREATE INDEX ix_prompt_values_stats ON prompt_values (value_set_id, split, v_star, num_correct, filtered);
    """)


def _metric_latest_v1(con: sqlite3.Connection) -> None:
    """The latest value of each metric of each run."""
    _script(con, """
        CREATE TABLE metric_latest (
            run_id INTEGER NOT NULL,
            name VARCHAR(200) NOT NULL,
            step INTEGER NOT NULL,
            value FLOAT,
            metric_id INTEGER NOT NULL,
            PRIMARY KEY (run_id, name),
            FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
        );
        INSERT INTO metric_latest (run_id, name, step, value, metric_id)
            SELECT run_id, name, step, value, id FROM (
                SELECT run_id, name, step, value, id,
                       row_number() OVER (PARTITION BY run_id, name ORDER BY step DESC, id DESC) AS rank
                FROM metrics)
            WHERE rank = 1;
    """)


def _scrub_specs(con: sqlite3.Connection) -> None:
    """Secrets scrubbed from the stored run specs."""
    for run_id, config in con.execute("SELECT id, config FROM runs").fetchall():
        try:
            spec = json.loads(config)
        except (TypeError, ValueError):
            continue
        clean = scrub_secrets(spec)
        if clean != spec:
            con.execute("UPDATE runs SET config = ? WHERE id = ?", (json.dumps(clean), run_id))


def _v2(con: sqlite3.Connection) -> None:
    """A covering index for metric curves by name: the Run page's training chart reads a run's curves downsampled
    in SQL (`Store.metric_series`) from the index alone, instead of looking up every metric row of the run
    (faster on a big run: docs/benchmarks.md, "Design figures")."""
    con.execute("CREATE INDEX ix_metrics_series ON metrics (run_id, name, step, value)")


def _v3(con: sqlite3.Connection) -> None:
    """Chunked runs (`app.runtime.chunks`): how many chunks a run has run and the seconds they took. The new status
    "paused" needs no change (statuses are plain text)."""
    _script(con, """
        ALTER TABLE runs ADD COLUMN chunks_done INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE runs ADD COLUMN chunk_seconds FLOAT NOT NULL DEFAULT 0
    """)


def _v4(con: sqlite3.Connection) -> None:
    """The run state machine's time counter (`storage.lifecycle`: seconds worked since the run was launched or
    resumed), and the position of a chunk's journal that the parent has applied (`Store.apply_journal`)."""
    _script(con, """
        ALTER TABLE runs ADD COLUMN limit_seconds FLOAT NOT NULL DEFAULT 0;
        ALTER TABLE runs ADD COLUMN journal_offset INTEGER NOT NULL DEFAULT 0
    """)


def _v5(con: sqlite3.Connection) -> None:
    """Each run's own V* rows (`run_values`), older runs' recomputed with the settings their spec names
    (`_rescore_runs`); the per-split counts of those rows on the run. Why: docs/migrations.md, step 5."""
    _script(con, """
        CREATE TABLE run_values (
            id INTEGER NOT NULL PRIMARY KEY,
            run_id INTEGER NOT NULL,
            value_id INTEGER NOT NULL,
            split VARCHAR(64) NOT NULL,
            prompt_id VARCHAR(200) NOT NULL,
            v_star FLOAT,
            num_correct INTEGER,
            filtered BOOLEAN NOT NULL,
            UNIQUE (run_id, split, prompt_id),
            FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE,
            FOREIGN KEY(value_id) REFERENCES prompt_values (id) ON DELETE CASCADE
        );
        INSERT INTO run_values (run_id, value_id, split, prompt_id, v_star, num_correct, filtered)
            SELECT r.id, p.id, p.split, p.prompt_id, p.v_star, p.num_correct, p.filtered
            FROM runs r JOIN prompt_values p ON p.value_set_id = r.value_set_id
            ORDER BY r.id, p.id;
        CREATE INDEX ix_run_values_stats ON run_values (run_id, split, v_star, num_correct, filtered, value_id);
        CREATE INDEX ix_run_values_order ON run_values (run_id, split, value_id);
        CREATE INDEX ix_run_values_value_id ON run_values (value_id);
        ALTER TABLE runs ADD COLUMN value_counts JSON NOT NULL DEFAULT '{}';
        ALTER TABLE runs ADD COLUMN values_revision INTEGER NOT NULL DEFAULT 0;
        UPDATE runs SET value_counts = coalesce((SELECT json_group_object(split, n) FROM
                                                   (SELECT split, count(*) AS n FROM run_values v
                                                    WHERE v.run_id = runs.id GROUP BY split)), '{}')
    """)
    _rescore_runs(con)


def _stated_settings(config: str | None) -> tuple[float | None, bool | None]:
    """The beta1 and `filter_all_incorrect` a stored run spec names (None: left to the library's default)."""
    try:
        spec = json.loads(config or "null")
    except ValueError:
        return None, None
    settings = spec.get("config") if isinstance(spec, dict) else None
    if not isinstance(settings, dict):
        return None, None
    beta1 = settings.get("beta1")
    if isinstance(beta1, bool) or not isinstance(beta1, (int, float)) or not math.isfinite(beta1) or beta1 <= 0:
        beta1 = None
    filter_all = settings.get("filter_all_incorrect")
    return (None if beta1 is None else float(beta1)), (filter_all if isinstance(filter_all, bool) else None)


def _optimal_value(rewards: list[float], beta1: float) -> float:
    """V* = beta1 * log(mean_i exp(r_i / beta1)), as `a2po.core.optimal_value` computes it (log-sum-exp)."""
    scaled = [float(r) / beta1 for r in rewards]
    top = max(scaled)
    return beta1 * (top + math.log(sum(math.exp(x - top) for x in scaled)) - math.log(len(scaled)))


def _rescore_runs(con: sqlite3.Connection) -> None:
    """Give each run's copied rows the V* and filter of its own stated settings (see `_v5`)."""
    for run_id, config in con.execute("SELECT id, config FROM runs WHERE value_set_id IS NOT NULL").fetchall():
        beta1, filter_all = _stated_settings(config)
        if beta1 is None and filter_all is None:
            continue
        rows = con.execute("SELECT v.id, p.rewards, v.v_star, v.num_correct, v.filtered FROM run_values v "
                           "JOIN prompt_values p ON p.id = v.value_id WHERE v.run_id = ?", (run_id,)).fetchall()
        changed = []
        for row_id, rewards_json, v_star, num_correct, filtered in rows:
            try:
                rewards = json.loads(rewards_json or "[]")
            except ValueError:
                rewards = []
            rewards = rewards if isinstance(rewards, list) and rewards else []
            if rewards and beta1 is not None:
                v_star = _optimal_value(rewards, beta1)
            if filter_all is not None:
                if rewards:
                    solved = sum(float(r) >= CORRECT_THRESHOLD for r in rewards) if num_correct is None else num_correct
                    filtered = filter_all and solved == 0
                else:  # a V* the dataset gave: filtered when it is 0, as the trainer decides
                    filtered = filter_all and v_star is not None and v_star <= 0
            changed.append((v_star, int(bool(filtered)), row_id))
        con.executemany("UPDATE run_values SET v_star = ?, filtered = ? WHERE id = ?", changed)


STEPS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5}
assert sorted(STEPS) == list(range(1, LATEST + 1)), "one step per version, in order"


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)  # we issue BEGIN ourselves
    con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return con


def schema_version(con: sqlite3.Connection) -> int:
    return con.execute("PRAGMA user_version").fetchone()[0]


def has_tables(con: sqlite3.Connection) -> bool:
    return con.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()[0] > 0


def check_not_newer(version: int, path: Path) -> None:
    if version > USER_VERSION:
        raise SchemaTooNew(f"{path} has schema version {version}, but this A*-PO Studio knows versions up to "
                           f"{USER_VERSION}: it was written by a newer studio. Upgrade the studio, or use another data "
                           "folder (--data-dir); nothing was changed.")


def upgrade(path: str | Path, backup: bool = True) -> tuple[int, int]:
    """Bring the database at `path` to `LATEST`; returns (version found, version now). A file without tables is
    left to the caller (it creates today's schema); `(0, 0)` then."""
    path = Path(path)
    con = _connect(path)
    try:
        found = schema_version(con)
        check_not_newer(found, path)
        if found >= LATEST or not has_tables(con):  # above LATEST: the revisions' (`ensure_schema`)
            return found, found
        if backup:
            target = path.with_name(f"{path.name}.v{found}.bak")
            copy = sqlite3.connect(target)
            try:
                con.backup(copy)
            finally:
                copy.close()
        # Rebuilding a table that others reference needs foreign keys off, which only takes effect outside a
        # transaction; each step checks them itself before committing.
        con.execute("PRAGMA foreign_keys = OFF")
        while True:
            con.execute("BEGIN IMMEDIATE")
            try:
                version = schema_version(con)  # again, under the lock: another process may have migrated
                check_not_newer(version, path)
                if version >= LATEST:  # another process got there first (and may have gone on into Alembic's)
                    con.execute("COMMIT")
                    break
                STEPS[version + 1](con)
                problems = con.execute("PRAGMA foreign_key_check").fetchall()
                if problems:
                    raise RuntimeError(f"Migrating {path} to schema {version + 1} left rows whose parent is "
                                       f"missing: {problems[:5]}; nothing was changed (a copy is in {path}.v"
                                       f"{found}.bak).")
                con.execute(f"PRAGMA user_version = {version + 1}")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return found, LATEST
    finally:
        con.close()


# ---------------------------------------------------------------------------------------------------- Alembic


def _has_table(conn: Connection, name: str) -> bool:
    if conn.dialect.name == "sqlite":
        query = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = :name"
    else:
        query = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND " \
                "table_name = :name"
    return conn.execute(text(query), {"name": name}).scalar() > 0


def alembic_revision(conn: Connection) -> str | None:
    """The database's Alembic revision, or None when it has no version table."""
    if not _has_table(conn, "alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _config(conn: Connection | None = None):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(REVISIONS))
    config.attributes["connection"] = conn
    return config


def _alembic(conn: Connection, command: str, revision: str) -> None:
    from alembic import command as commands

    getattr(commands, command)(_config(conn), revision)


def _describe(conn: Connection) -> str:
    return conn.engine.url.render_as_string(hide_password=True)


def ensure_schema(conn: Connection) -> str | None:
    """Bring the database of `conn` (inside a write transaction of the caller's) to `HEAD`; returns the revision
    found (None: none). Who gets what: docs/migrations.md."""
    if conn.dialect.name == "postgresql":
        from storage.dialects import advisory_key

        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key("migrations")})
    found = alembic_revision(conn)
    if found == HEAD:
        return found
    if found is None:
        if not _has_table(conn, "runs"):
            _upgrade_to_head(conn)
            return None
        if conn.dialect.name != "sqlite" or schema_version(conn.connection.dbapi_connection) != LATEST:
            raise NotAStudio(f"{_describe(conn)} has a table 'runs' but no alembic_version: it is not a studio "
                             "database this studio knows. Give an empty database (or a SQLite studio.db); to "
                             "bring a SQLite studio to a server, use python -m storage.move.")
        _upgrade_to_head(conn, BASELINE, stamp=True)  # the revisions after the baseline
        return None
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        ScriptDirectory.from_config(_config()).get_revision(found)
    except CommandError:
        raise SchemaTooNew(f"{_describe(conn)} has schema revision {found!r}, which this A*-PO Studio does not "
                           f"know (its newest is {HEAD!r}): it was written by a newer studio. Upgrade the studio, "
                           "or use another database; nothing was changed.") from None
    _upgrade_to_head(conn, found)
    return found


def _upgrade_to_head(conn: Connection, found: str | None = None, stamp: bool = False) -> None:
    """Apply the revisions after `found` (None: all, on an empty database; `stamp`: first record `found`, the
    schema the database already has), keeping a copy of a SQLite file that has tables first."""
    copy = backup_copy(conn, found) if found is not None and conn.dialect.name == "sqlite" else None
    if stamp:
        _alembic(conn, "stamp", found)
    _alembic(conn, "upgrade", "head")
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"PRAGMA user_version = {USER_VERSION}")  # see `USER_VERSION`
    applied = ", ".join(pending(found))
    if found is None:
        logger.info("Created the studio's tables in %s (revisions %s).", _describe(conn), applied)
    else:
        logger.warning("Upgraded the studio database %s from revision %s to %s: applied %s%s.", _describe(conn),
                       found, HEAD, applied, f"; its copy from before is {copy}" if copy else "")


def pending(found: str | None) -> list[str]:
    """The revisions an upgrade from `found` (None: an empty database) to `HEAD` applies, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config())
    return [r.revision for r in reversed(list(script.iterate_revisions(HEAD, found or "base")))]


def backup_copy(conn: Connection, revision: str) -> Path:
    """Copy the SQLite file of `conn` to `<file>.<revision>.bak` beside it (SQLite's online backup). Read through
    a connection of its own: the caller's transaction holds the write lock, so nobody changes the file meanwhile
    and the copy is the file as it is before the caller's changes."""
    path = Path(conn.engine.url.database)
    target = path.with_name(f"{path.name}.{revision}.bak")
    source, copy = _connect(path), sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    return target
