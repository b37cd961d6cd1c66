"""`python -m storage.move`: a SQLite studio carried into an empty PostgreSQL database, every table equal row by
row, ids kept and continued; a target with rows, or a source a studio serves, is refused with nothing written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, text

from storage import Store, lifecycle
from storage.move import MoveRefused, move, tables
from tests.storage.test_storage import SPEC, sample, value_record


def make_studio(path: Path) -> dict[str, int]:
    """A small studio through the Store's own methods: two value sets, runs of each status that matter, a resumed
    run naming its parent, a deleted run (its id must not come back), and rows in every table."""
    store = Store(path)
    vs = store.get_or_create_value_set("fp-1", {"model": "tiny", "num_value_samples": 2})
    store.get_or_create_value_set("fp-empty", {})  # summary stays SQL NULL
    store.add_values(vs, "train", [value_record(p) for p in "abc"])
    store.add_values(vs, "eval", [value_record("z", v_star=None, prompt="plain")])
    store.mark_value_set_complete(vs, {"train": {"mean_v_star": 0.5}})
    runs = {}
    for name in ("finished", "running", "queued", "gone"):
        run_id = store.create_run(name, "train", {**SPEC, "name": name}, model="tiny", owner="ann")
        store.update_run(run_id, value_set_id=vs, stage="train", progress=0.5, output_dir=f"/data/runs/run-{run_id}")
        store.set_run_values(run_id, "train", [dict(value_record(p), v_star=0.25 * i) for i, p in enumerate("abc")])
        store.add_metrics(run_id, 1, {"loss": 1.5, "reward": 0.25})
        store.add_metrics(run_id, 2, {"loss": float("nan"), "reward": 0.5})
        store.add_samples(run_id, [sample(1, "a"), sample(2, "b", reward=0.0)])
        store.add_evaluation(run_id, 2, {"eval_accuracy": 0.5})
        store.add_checkpoint(run_id, 2, f"/data/runs/run-{run_id}/checkpoint-2")
        store.add_logs(run_id, [("INFO", f"{name} started"), ("WARNING", "careful")])
        runs[name] = run_id
    for event in lifecycle.path("finished"):
        store.apply(runs["finished"], event, pid=1)
    store.apply(runs["running"], lifecycle.CLAIM, pid=2)
    runs["child"] = store.create_run("child", "train", SPEC, parent_run_id=runs["finished"])
    store.delete_run(runs.pop("gone"))
    deleted = store.create_run("deleted last", "train", SPEC)  # the highest id given, gone from the table
    store.delete_run(deleted)
    store.close()
    return runs


def dump(url_or_path) -> dict[str, list[tuple]]:
    """Every row of every studio table, in primary-key order, with which JSON cells are SQL NULL."""
    store = Store(url_or_path)
    out = {}
    with store._read() as s:
        for table in tables():
            nulls = [c.is_(None) for c in table.c if c.type.__class__.__name__ == "JSON"]
            stmt = select(table, *nulls).order_by(*table.primary_key.columns)
            out[table.name] = [tuple(row) for row in s.execute(stmt)]
    store.close()
    return out


@pytest.fixture
def studio(tmp_path) -> tuple[Path, dict[str, int]]:
    path = tmp_path / "data" / "studio.db"
    return path, make_studio(path)


def test_a_studio_moves_row_by_row_with_its_ids(studio, postgres_server):
    path, runs = studio
    target = postgres_server.create_database()
    seen = []
    moved = move(path, target, batch=2, progress=lambda *p: seen.append(p))  # batches smaller than the tables
    before, after = dump(path), dump(target)
    assert set(after) == {t.name for t in tables()}
    for name, rows in before.items():
        assert after[name] == rows, name
        assert moved.rows[name] == len(rows)
    assert all(moved.rows[t] for t in ("runs", "value_sets", "prompt_values", "run_values", "metrics",
                                       "metric_latest", "samples", "evaluations", "checkpoints", "logs"))
    assert ("metrics", 2, len(before["metrics"])) in seen and seen[-1][1] == seen[-1][2]  # per batch, to the total
    store = Store(target)
    assert store.get_run(runs["child"])["parent_run_id"] == runs["finished"]
    assert store.get_run(runs["running"])["status"] == "running"
    assert store.value_stats(runs["finished"], "train")["count"] == 3
    # New ids follow the highest the studio ever gave, the deleted run's included.
    assert store.create_run("new", "train", SPEC) == max(runs.values()) + 2 == 7
    assert store.get_or_create_value_set("fp-new", {}) == 3
    assert store.add_metrics(runs["finished"], 3, {"loss": 0.1}) == 1
    store.close()


def test_a_target_that_holds_rows_is_refused_untouched(studio, postgres_server):
    path, _ = studio
    target = postgres_server.create_database()
    store = Store(target)
    store.create_run("already here", "train", SPEC)
    store.close()
    with pytest.raises(MoveRefused, match=r"already holds studio rows \(runs: 1\)"):
        move(path, target)
    assert [r["name"] for r in Store(target).list_runs()] == ["already here"]


def test_a_source_a_studio_serves_is_refused(studio, postgres_server):
    from app.runtime.scheduler import AlreadyServing

    path, _ = studio
    lock = Store(path).scheduler_lock(AlreadyServing)
    lock.acquire(address="http://127.0.0.1:1")
    target = postgres_server.create_database()
    try:
        refused = r"already serving .*http://127.0.0.1:1.*Stop that studio, then move the source"
        with pytest.raises(MoveRefused, match=refused):
            move(path, target)
    finally:
        lock.release()
    # And a target a studio serves.
    served = Store(target).scheduler_lock(AlreadyServing)
    served.acquire()
    try:
        with pytest.raises(MoveRefused, match="already serving the database .*Stop that studio, then move the target"):
            move(path, target)
    finally:
        served.release()
    assert Store(target).list_runs() == []


def test_the_command_line_shows_progress_and_refuses_a_second_move(studio, postgres_server, tmp_path):
    path, runs = studio
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    target = postgres_server.create_database()
    command = [sys.executable, "-m", "storage.move", "--from", str(path), "--to", target]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "  runs: 4/4 rows (100%)" in done.stderr and "rows in 10 tables moved" in done.stdout
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 2 and "already holds studio rows" in again.stderr
    with Store(target)._read() as s:
        assert s.execute(text("SELECT count(*) FROM runs")).scalar() == len(runs)
