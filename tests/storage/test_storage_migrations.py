"""Schema versions and migrations: a database written before versions existed (`tests/fixtures/studio-v0.db`,
written by the code of commit 83b92c1, see `tests/fixtures/make_studio_v0.py`) and one of schema 3
(`tests/fixtures/studio-v3.db`, commit 60d44ba, `make_studio_v3.py`) open, migrate without loss, and end up with
exactly the schema a new database gets; their runs keep the V* rows they showed."""

from __future__ import annotations

import json
import math
import multiprocessing
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from storage import Store, migrations

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "studio-v0.db"
# Run columns renamed by revision 0003 (old name -> new name).
RENAMED = {"kind": "action", "num_devices": "num_processes"}
FIXTURE_V3 = Path(__file__).resolve().parents[1] / "fixtures" / "studio-v3.db"


@pytest.fixture
def v0_db(tmp_path) -> Path:
    path = tmp_path / "studio.db"
    shutil.copy(FIXTURE, path)
    return path


def table_rows(path: Path) -> dict[str, list[dict]]:
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                        "AND name NOT LIKE 'sqlite%'")]
    rows = {t: [dict(r) for r in con.execute(f"SELECT * FROM {t} ORDER BY rowid")] for t in tables}
    con.close()
    return rows


def schema(path: Path) -> dict[str, object]:
    """Tables with their columns (name, type, not null, primary key), indexes with their columns, AUTOINCREMENT."""
    con = sqlite3.connect(path)
    out: dict[str, object] = {}
    for (table, sql) in con.execute("SELECT name, sql FROM sqlite_master WHERE type='table' AND name NOT LIKE "
                                    "'sqlite%' ORDER BY name"):
        columns = sorted((c[1], c[2], c[3], c[5]) for c in con.execute(f"PRAGMA table_info({table})"))
        indexes = sorted((i[1], i[2], tuple(c[2] for c in con.execute(f"PRAGMA index_info('{i[1]}')")))
                         for i in con.execute(f"PRAGMA index_list({table})"))
        foreign = sorted(tuple(f[2:6]) + (f[6],) for f in con.execute(f"PRAGMA foreign_key_list({table})"))
        out[table] = {"columns": columns, "indexes": indexes, "foreign": foreign,
                      "autoincrement": "AUTOINCREMENT" in sql.upper()}
    con.close()
    return out


def test_fixture_is_the_old_schema():
    con = sqlite3.connect(FIXTURE)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    assert "stop_reason" not in {c[1] for c in con.execute("PRAGMA table_info(runs)")}
    con.close()


def test_migrates_the_old_database_without_loss(v0_db):
    before = table_rows(v0_db)
    store = Store(v0_db)
    after = table_rows(v0_db)
    con = sqlite3.connect(v0_db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == migrations.USER_VERSION
    con.close()

    # Every stored row and value is still there (only the credential in a spec is gone), new columns filled in.
    for table, rows in before.items():
        assert len(after[table]) == len(rows), table
        for old, new in zip(rows, after[table]):
            for column, value in old.items():
                if table == "runs":
                    column = RENAMED.get(column, column)
                if table == "runs" and column == "config":
                    spec = json.loads(value)
                    assert "hub_token" in spec["config"]
                    del spec["config"]["hub_token"]
                    assert json.loads(new[column]) == spec
                else:
                    assert new[column] == value, (table, column)
    assert [r["id"] for r in after["runs"]] == [1, 3]
    assert all(r["num_processes"] == 1 and r["auto_resumes"] == 0 and r["launch_failures"] == 0 for r in after["runs"])
    # The derived tables agree with the rows they summarise.
    assert store.list_value_sets()[0]["counts"] == {"train": 4, "eval": 1}
    assert store.count_values(1, "train") == 4 and store.count_values(1, None) == 5
    assert store.latest_metrics(1) == {"loss": {"step": 2, "value": 0.25}, "reward": {"step": 2, "value": 0.5},
                                       "learning_rate": {"step": 2, "value": 2e-5}}
    assert [v["prompt_id"] for v in store.get_values(1, "train")] == ["p0", "p1", "p2", "p3"]
    assert store.get_evaluations(1)[0]["metrics"] == {"eval_accuracy": 0.5, "eval_loss": 0.1}

    # A copy of the old file was kept, untouched.
    backup = v0_db.with_name("studio.db.v0.bak")
    assert table_rows(backup) == before
    # Ids are never reused any more: the newest run deleted, the next one still gets a new id.
    newest = store.create_run("after-migration", "train", {})
    assert newest == 4
    assert store.delete_run(newest)
    assert store.create_run("next", "train", {}) == 5
    store.close()
    # Opening again changes nothing.
    assert migrations.upgrade(v0_db) == (migrations.USER_VERSION, migrations.USER_VERSION)


def test_migrated_schema_is_the_new_schema(v0_db, tmp_path):
    Store(v0_db).close()
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    assert schema(v0_db) == schema(fresh)
    assert schema(fresh)["runs"]["autoincrement"] and schema(fresh)["value_sets"]["autoincrement"]


def test_a_schema_3_database_migrates_without_loss(tmp_path):
    path = tmp_path / "studio.db"
    shutil.copy(FIXTURE_V3, path)
    before = table_rows(path)
    store = Store(path)
    after = table_rows(path)
    for table, rows in before.items():
        assert len(after[table]) == len(rows), table
        for old, new in zip(rows, after[table]):
            names = RENAMED if table == "runs" else {}
            assert {k: new[names.get(k, k)] for k in old} == old, table
    runs = {r["name"]: r for r in store.list_runs()}
    assert runs["finished"]["chunks_done"] == 1 and runs["finished"]["chunk_seconds"] == 12.5
    assert runs["interrupted"]["auto_resumes"] == 2 and runs["interrupted"]["status"] == "interrupted"
    assert all(r["limit_seconds"] == 0 and r["journal_offset"] == 0 for r in runs.values())
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    store.close()
    assert schema(path) == schema(fresh)


@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE_V3], ids=["v0", "v3"])
def test_old_runs_get_their_value_sets_rows_as_their_own(fixture, tmp_path):
    """Schema 5 gives each run its own V* rows; a run from before shows its value set's, as it did then."""
    path = tmp_path / "studio.db"
    shutil.copy(fixture, path)
    con = sqlite3.connect(path)
    stored = con.execute("SELECT split, prompt_id, v_star, num_correct, filtered FROM prompt_values "
                         "WHERE value_set_id = 1 ORDER BY id").fetchall()
    con.close()
    store = Store(path)
    runs = {r["id"]: r for r in store.list_runs()}
    assert runs[1]["value_set_id"] == 1 and stored
    mine = [(r["split"], r["prompt_id"], r["v_star"], r["num_correct"], int(r["filtered"]))
            for r in store.iter_values(1)]
    assert mine == stored
    counts: dict[str, int] = {}
    for split, *_ in stored:
        counts[split] = counts.get(split, 0) + 1
    assert runs[1]["value_counts"] == counts and runs[1]["values_revision"] == 0
    assert store.value_stats(1, "train")["count"] == counts["train"]
    assert [r["prompt_id"] for r in store.values_page(1, "train")] == [p for s, p, *_ in stored if s == "train"]
    other = next(r for r in runs.values() if r["value_set_id"] is None)  # no value set: no rows
    assert other["value_counts"] == {} and list(store.iter_values(other["id"])) == []
    store.close()


@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE_V3], ids=["v0", "v3"])
def test_old_runs_that_name_their_settings_get_the_v_star_they_trained_with(fixture, tmp_path):
    """A run whose stored spec names beta1 and `filter_all_incorrect` trained with V* recomputed from the shared
    rewards with them: the migration gives it those, not the value set's; a setting left out keeps the shared
    value (storage does not know the library's default)."""
    path = tmp_path / "studio.db"
    shutil.copy(fixture, path)
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET config = json_set(config, '$.config.beta1', 0.1, '$.config.filter_all_incorrect', "
                "json('false')) WHERE id = 1")
    con.commit()
    stored = con.execute("SELECT split, prompt_id, rewards, num_correct, filtered FROM prompt_values "
                         "WHERE value_set_id = 1 ORDER BY id").fetchall()
    con.close()
    store = Store(path)
    mine = {(r["split"], r["prompt_id"]): r for r in store.iter_values(1)}
    assert len(mine) == len(stored)
    for split, prompt_id, rewards, correct, _ in stored:
        n = len(json.loads(rewards))
        by_hand = 0.1 * math.log((correct * math.exp(1 / 0.1) + n - correct) / n)
        assert mine[split, prompt_id]["v_star"] == pytest.approx(by_hand, rel=1e-12), prompt_id
        assert mine[split, prompt_id]["filtered"] is False and mine[split, prompt_id]["num_correct"] == correct
    # Only the filter named: the shared V*, the run's own filter.
    store.close()
    shutil.copy(fixture, path)
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET config = json_set(config, '$.config.filter_all_incorrect', json('true')) "
                "WHERE id = 1")
    con.commit()
    shared = con.execute("SELECT prompt_id, v_star FROM prompt_values WHERE value_set_id = 1 ORDER BY id").fetchall()
    con.close()
    store = Store(path)
    rows = list(store.iter_values(1))
    assert [(r["prompt_id"], r["v_star"]) for r in rows] == shared
    assert [r["filtered"] for r in rows] == [r["num_correct"] == 0 for r in rows]
    unsolved = sum(r["num_correct"] == 0 for r in rows if r["split"] == "train")
    assert store.value_stats(1, "train")["filtered"] == unsolved
    store.close()


def test_a_newer_database_is_refused_untouched(tmp_path):
    path = tmp_path / "studio.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {migrations.USER_VERSION + 1}")
    con.close()
    before = path.read_bytes()
    with pytest.raises(migrations.SchemaTooNew, match="newer studio"):
        Store(path)
    assert path.read_bytes() == before


def test_a_failed_step_leaves_the_old_version(v0_db, monkeypatch):
    def broken(con):
        migrations._v1(con)
        raise RuntimeError("disk full")

    monkeypatch.setitem(migrations.STEPS, 1, broken)
    with pytest.raises(RuntimeError, match="disk full"):
        Store(v0_db)
    con = sqlite3.connect(v0_db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    assert "stop_reason" not in {c[1] for c in con.execute("PRAGMA table_info(runs)")}
    con.close()
    monkeypatch.undo()
    assert [r["id"] for r in Store(v0_db).list_runs()] == [3, 1]


def _open(path: str) -> int:
    return len(Store(path).list_runs())


def test_two_processes_migrate_one_file_at_once(v0_db):
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        assert pool.map(_open, [str(v0_db)] * 2) == [2, 2]
    assert migrations.upgrade(v0_db) == (migrations.USER_VERSION, migrations.USER_VERSION)


def test_a_file_another_process_migrated_all_the_way_is_left_as_it_is(v0_db, monkeypatch):
    """The race the test above meets at random, made certain: our first look finds the file before versions, and by
    the time we hold the write lock another process has taken it through every step and on into Alembic's."""
    Store(v0_db)  # the other process: the file is now past `LATEST`
    real = migrations.schema_version
    looks = []

    def first_look_is_stale(con):
        looks.append(1)
        return 0 if len(looks) == 1 else real(con)

    monkeypatch.setattr(migrations, "schema_version", first_look_is_stale)
    before = table_rows(v0_db)
    assert migrations.upgrade(v0_db, backup=False) == (0, migrations.LATEST)
    assert table_rows(v0_db) == before


def test_secrets_are_never_stored(tmp_path):
    store = Store(tmp_path / "studio.db")
    spec = {"config": {"hub_token": "hf_x", "learning_rate": 1e-5, "nested": {"api_key": "k", "keep": 1}},
            "password": "p", "tokenizer": "kept"}
    run_id = store.create_run("r", "train", spec)
    assert store.get_run(run_id)["config"] == {"config": {"learning_rate": 1e-5, "nested": {"keep": 1}},
                                               "tokenizer": "kept"}
    store.update_run(run_id, config={"config": {"hf_token": "x"}})
    assert store.get_run(run_id)["config"] == {"config": {}}


# ---------------------------------------------------------------------------------------------------- Alembic
# The revisions (storage/revisions) on both dialects: `store_url` is a new SQLite file, then a new PostgreSQL
# database (tests/conftest.py).


def _revision(store: Store) -> list[str]:
    with store._read() as s:
        return list(s.execute(text("SELECT version_num FROM alembic_version")).scalars())


def test_head_is_the_newest_revision():
    from alembic.script import ScriptDirectory

    assert ScriptDirectory.from_config(migrations._config()).get_heads() == [migrations.HEAD]


def test_the_revisions_give_the_schema_the_models_describe(store_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from storage.models import Base

    store = Store(store_url)
    with store._read() as s:
        assert compare_metadata(MigrationContext.configure(s.connection()), Base.metadata) == []
    assert _revision(store) == [migrations.HEAD]
    store.close()


def test_a_migrated_file_is_stamped_at_the_baseline(v0_db):
    store = Store(v0_db)
    assert _revision(store) == [migrations.HEAD]  # stamped at the baseline, then the revisions after it
    assert store.list_runs() and Store(v0_db).list_runs() == store.list_runs()  # opening again changes nothing
    store.close()


def test_an_unknown_revision_is_refused_untouched(store_url):
    store = Store(store_url)
    run_id = store.create_run("kept", "train", {})
    with store._write() as s:
        s.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    store.close()
    with pytest.raises(migrations.SchemaTooNew, match="newer studio"):
        Store(store_url)
    assert _revision(store) == ["ffff"] and store.get_run(run_id)["name"] == "kept"
    store.close()


def test_a_database_with_other_tables_named_runs_is_refused(postgres_server):
    from sqlalchemy import create_engine

    url = postgres_server.create_database()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE runs (id integer)"))
    engine.dispose()
    with pytest.raises(migrations.NotAStudio, match="not a studio database"):
        Store(url)


def test_two_processes_create_one_schema_at_once(store_url):
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        assert pool.map(_open, [store_url] * 3) == [0, 0, 0]
    store = Store(store_url)
    assert _revision(store) == [migrations.HEAD]
    store.close()


# ---------------------------------------------------------------------------------------------------- upgrades
# Between revisions: a copy of a SQLite file first, the revisions applied in the log; a downgrade gives back what it
# removed or refuses.


def _to_revision(url: str, revision: str, chain_file: Path | None = None) -> None:
    """Bring a database to `revision` only, as a studio of that revision leaves it: an empty one, or (`chain_file`)
    the schema-3 fixture migrated by the chain and stamped at the baseline first."""
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        if chain_file is not None:
            migrations.upgrade(chain_file, backup=False)
            migrations._alembic(conn, "stamp", migrations.BASELINE)
        migrations._alembic(conn, "upgrade", revision)
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(f"PRAGMA user_version = {migrations.USER_VERSION}")
    engine.dispose()


def test_an_upgrade_between_revisions_keeps_a_copy_first(tmp_path, caplog):
    path = tmp_path / "studio.db"
    shutil.copy(FIXTURE_V3, path)
    _to_revision(f"sqlite:///{path}", "0003", chain_file=path)
    before = table_rows(path)
    assert before["alembic_version"] == [{"version_num": "0003"}] and before["samples"]
    with caplog.at_level("INFO", "storage.migrations"):
        store = Store(path)
    assert _revision(store) == [migrations.HEAD]
    copy = path.with_name("studio.db.0003.bak")
    assert table_rows(copy) == before  # the old file, readable, as it was
    said = [r.getMessage() for r in caplog.records if r.name == "storage.migrations"]
    assert any("from revision 0003" in m and "applied 0004" in m and str(copy) in m for m in said), said
    assert [s["prompt_id"] for s in store.get_samples(before["samples"][0]["run_id"])] == \
        [s["prompt_id"] for s in before["samples"]]
    store.close()
    Store(path).close()  # at HEAD: nothing to change, no copy
    assert sorted(p.name for p in tmp_path.glob("*.bak")) == ["studio.db.0003.bak"]


def test_a_server_upgrade_says_which_revisions_it_applied(postgres_server, caplog):
    url = postgres_server.create_database()
    _to_revision(url, "0002")
    with caplog.at_level("INFO", "storage.migrations"):
        Store(url).close()
    said = [r.getMessage() for r in caplog.records if r.name == "storage.migrations"]
    assert any("from revision 0002" in m and "applied 0003, 0004" in m for m in said), said


def _samples_table(store: Store) -> tuple[list[str], list[list[str]]]:
    from sqlalchemy import inspect

    with store._read() as s:
        inspector = inspect(s.connection())
        columns = [c["name"] for c in inspector.get_columns("samples")]
        keys = sorted(sorted(u["column_names"]) for u in inspector.get_unique_constraints("samples"))
    return columns, keys


def _downgrade(store: Store, revision: str) -> None:
    try:
        with store._write() as s:
            migrations._alembic(s.connection(), "downgrade", revision)
    finally:
        store.close()


OLD_SAMPLE_KEY = sorted(("run_id", "split", "step", "prompt_id"))


def test_0004_downgrades_to_the_schema_of_0003_and_upgrades_again(store_url, tmp_path):
    store = Store(store_url)
    run_id = store.create_run("a*-po", "train", {})
    store.add_samples(run_id, [{"step": 1, "prompt_id": "p0", "completion": "4"}])
    _downgrade(store, "0003")
    assert _revision(store) == ["0003"]
    columns, keys = _samples_table(store)
    assert "sample_index" not in columns and keys == [OLD_SAMPLE_KEY]
    if store.path is not None:  # exactly the file a studio of 0003 made
        fresh = tmp_path / "fresh.db"
        _to_revision(f"sqlite:///{fresh}", "0003")
        assert schema(store.path) == schema(fresh)
    store.close()
    again = Store(store_url)  # upgraded again: the key of 0004, the sample kept
    assert _revision(again) == [migrations.HEAD]
    assert _samples_table(again)[1] == [sorted([*OLD_SAMPLE_KEY, "sample_index"])]
    assert [s["completion"] for s in again.get_samples(run_id)] == ["4"]
    again.close()


def test_0004_refuses_to_downgrade_a_grpo_group(store_url):
    """The key of 0003 cannot hold G samples of one prompt and step: the downgrade refuses and changes nothing."""
    store = Store(store_url)
    run_id = store.create_run("grpo", "train", {})
    store.add_samples(run_id, [{"step": 1, "prompt_id": "p0", "sample_index": i, "completion": str(i)} for i in (0, 1)])
    with pytest.raises(RuntimeError, match="Revision 0004 cannot be undone .* 1 samples belong to GRPO groups"):
        _downgrade(store, "0003")
    assert _revision(store) == [migrations.HEAD] and len(store.get_samples(run_id)) == 2
    store.close()


def test_0005_gives_the_v_star_sets_stored_before_it_what_their_runs_paid_for_them(store_url):
    """A V* set of before 0005 has no cost: the upgrade sums the stage-1 cost its runs logged (a run that reused
    the rows logged none), for the prompts the set holds, so a run that reuses it is charged (equal time)."""
    store = Store(store_url)
    value_set = store.get_or_create_value_set("fp", {})
    store.add_values(value_set, "train", [{"prompt_id": f"p{i}", "v_star": 0.5, "rewards": [0.0, 1.0]}
                                          for i in range(4)])
    store.add_values(value_set, "eval", [{"prompt_id": "q0", "v_star": 0.5, "rewards": [0.0, 1.0]}])
    assert store.value_set_cost(value_set) == {}  # no cost given: none recorded
    paid = {"sampled-half": (3.0, 100, 1.0), "sampled-the-rest": (1.5, 40, None), "reused-it": (None, None, None)}
    for name, (seconds, tokens, eval_seconds) in paid.items():
        run_id = store.create_run(name, "train", {})
        store.update_run(run_id, value_set_id=value_set)
        if seconds is not None:
            store.add_metrics(run_id, 0, {"values/train/runtime": 1.0, "values/train/completion_tokens": 10})
            store.add_metrics(run_id, 3, {"values/train/runtime": seconds, "values/train/completion_tokens": tokens,
                                          "train_seconds": 9.0})  # its latest, cumulative
        if eval_seconds is not None:
            store.add_metrics(run_id, 0, {"values/eval/runtime": eval_seconds})
    other = store.create_run("another-set", "train", {})
    store.add_metrics(other, 0, {"values/train/runtime": 50.0})
    _downgrade(store, "0004")
    assert _revision(store) == ["0004"]
    upgraded = Store(store_url)
    assert _revision(upgraded) == [migrations.HEAD]
    assert upgraded.value_set_cost(value_set) == {"train": {"seconds": 4.5, "tokens": 140, "prompts": 4},
                                                  "eval": {"seconds": 1.0, "tokens": 0, "prompts": 1}}
    upgraded.close()
