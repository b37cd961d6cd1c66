"""Move a studio's database to another one: `python -m storage.move --from data/studio.db --to postgresql+psycopg://...`.

Every table of the studio (runs, value sets and their prompt values, each run's V* rows, metrics and their latest
values, samples, evaluations, checkpoints, logs) is copied row by row with its ids, so the run ids that pages,
exports, logs and run folders (`runs/run-<id>`) name stay right. The target's id sequences then continue after the
highest id the source ever gave (SQLite's AUTOINCREMENT counter included: a deleted run's id is not given again).

Safe to run again after a failure: the whole copy is one transaction on the target, which stays empty unless it
completes. It refuses a target that already holds studio rows, and a source or target that a studio serves (stop
the studio first; the copy reads one consistent snapshot of the source, and a studio writing meanwhile would lose
what it wrote after it). The source is opened as the studio opens it, so an older SQLite file is first migrated in
place (a copy of it kept, `storage.migrations`). The data folder (checkpoints, final models, logs, exports) is not
in the database: it stays where it is, or is moved with the usual tools (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import JSON, Table, func, null, select, text, update
from sqlalchemy.engine import Connection

from storage import dialects
from storage.models import Base, Run
from storage.store import Store

BATCH = 5000


class MoveRefused(RuntimeError):
    """The move cannot start: nothing was written."""


@dataclass
class Moved:
    """What `move` copied: rows per table, in copy order, and how long it took."""

    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def tables() -> list[Table]:
    """The studio's tables, parents before children."""
    return list(Base.metadata.sorted_tables)


def _order(table: Table):
    return list(table.primary_key.columns)


def _counts(conn: Connection) -> dict[str, int]:
    return {t.name: conn.execute(select(func.count()).select_from(t)).scalar() for t in tables()}


def _check_not_served(store: Store, role: str) -> Callable[[], None]:
    """Refuse a database a studio serves; returns what releases the lock taken to keep one from starting."""
    lock = store.scheduler_lock(MoveRefused, hint=f"Stop that studio, then move the {role}; nothing was written.")
    lock.acquire(purpose=f"storage.move {role}")
    return lock.release


def _high_water(conn: Connection, table: Table) -> int:
    """The highest id the database ever gave in `table` (SQLite's AUTOINCREMENT counter remembers deleted rows)."""
    if "id" not in table.c:
        return 0
    highest = conn.execute(select(func.coalesce(func.max(table.c.id), 0))).scalar()
    if dialects.dialect_of(conn) == dialects.SQLITE and table.dialect_options["sqlite"].get("autoincrement"):
        counter = conn.execute(text("SELECT seq FROM sqlite_sequence WHERE name = :name"),
                               {"name": table.name}).scalar()
        highest = max(highest, int(counter or 0))
    return int(highest)


def _continue_ids(conn: Connection, table: Table, after: int) -> None:
    """Make the target's next id of `table` follow `after`."""
    if "id" not in table.c:
        return
    if dialects.dialect_of(conn) == dialects.POSTGRESQL:
        conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), :value, :called)"),
                     {"value": max(after, 1), "called": after >= 1})
    elif table.dialect_options["sqlite"].get("autoincrement"):
        conn.execute(text("UPDATE sqlite_sequence SET seq = max(seq, :after) WHERE name = :name"),
                     {"after": after, "name": table.name})


def move(source: str | os.PathLike[str], target: str, batch: int = BATCH,
         progress: Callable[[str, int, int], None] | None = None) -> Moved:
    """Copy the studio database `source` into the empty database `target` (see the module docstring);
    `progress(table, copied, total)` after each batch. `MoveRefused` when it cannot start."""
    src, dst = Store(source), Store(target)
    if src.url == dst.url:
        raise MoveRefused(f"--from and --to are the same database ({src!r}).")
    releases = [_check_not_served(src, "source"), _check_not_served(dst, "target")]
    started = time.monotonic()
    moved = Moved()
    try:
        with src._engines()[0].connect() as read, read.begin(), dst._engines()[1].begin() as write:
            filled = {name: n for name, n in _counts(write).items() if n}
            if filled:
                listed = ", ".join(f"{name}: {n}" for name, n in filled.items())
                raise MoveRefused(f"The target {dst!r} already holds studio rows ({listed}): move into an empty "
                                  "database (e.g. createdb a new one); nothing was written.")
            totals = _counts(read)
            for table in tables():
                copied = 0
                # A run may name a parent with a higher id (a later run resumed into an older one's place never
                # happens, but nothing forbids it): parents are set once every run is in.
                parents = []
                last = None
                while True:
                    stmt = select(table).order_by(*_order(table)).limit(batch)
                    if last is not None:
                        key = _order(table)
                        stmt = stmt.where(key[0] > last[0]) if len(key) == 1 else stmt.where(
                            (key[0] > last[0]) | ((key[0] == last[0]) & (key[1] > last[1])))
                    # JSON columns read SQL NULL and JSON null both as None, and would write JSON null: which
                    # rows held SQL NULL is read beside them, and set again after the insert.
                    nulls = [c for c in table.c if isinstance(c.type, JSON) and c.nullable]
                    stmt = stmt.add_columns(*(c.is_(None).label(f"_null_{c.name}") for c in nulls))
                    rows = [dict(row) for row in read.execute(stmt).mappings()]
                    if not rows:
                        break
                    sql_null = {c.name: [r["id"] for r in rows if r.pop(f"_null_{c.name}")] for c in nulls}
                    if table is Run.__table__:
                        parents += [(r["id"], r["parent_run_id"]) for r in rows if r["parent_run_id"] is not None]
                        rows = [dict(r, parent_run_id=None) for r in rows]
                    write.execute(table.insert(), rows)
                    for name, ids in sql_null.items():
                        if ids:
                            write.execute(update(table).where(table.c.id.in_(ids)).values({name: null()}))
                    copied += len(rows)
                    last = tuple(rows[-1][c.name] for c in _order(table))
                    if progress is not None:
                        progress(table.name, copied, totals[table.name])
                    if len(rows) < batch:
                        break
                for run_id, parent in parents:
                    write.execute(update(Run).where(Run.id == run_id).values(parent_run_id=parent))
                _continue_ids(write, table, _high_water(read, table))
                moved.rows[table.name] = copied
                if progress is not None and not copied:
                    progress(table.name, 0, 0)
            landed = _counts(write)
            if landed != totals:
                raise RuntimeError(f"The copy does not match its source (source {totals}, target {landed}); "
                                   "nothing was written.")
    finally:
        for release in releases:
            release()
        src.close()
        dst.close()
    moved.seconds = time.monotonic() - started
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storage.move", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--from", dest="source", required=True, metavar="PATH_OR_URL",
                        help="the studio database to copy (e.g. data/studio.db)")
    parser.add_argument("--to", dest="target", required=True, metavar="URL",
                        help="an empty database, e.g. postgresql+psycopg://studio@dbhost/studio")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"rows per read and insert (default {BATCH})")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be at least 1")

    def show(table: str, copied: int, total: int) -> None:
        if not args.quiet:
            share = f" ({100 * copied / total:.0f}%)" if total else ""
            print(f"  {table}: {copied}/{total} rows{share}", file=sys.stderr, flush=True)

    try:
        moved = move(args.source, args.target, batch=args.batch, progress=show)
    except (MoveRefused, ValueError) as error:
        print(f"storage.move: {error}", file=sys.stderr)
        return 2
    print(f"storage.move: {sum(moved.rows.values())} rows in {len(moved.rows)} tables moved in "
          f"{moved.seconds:.1f} s.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
