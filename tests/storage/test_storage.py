"""Tests of `storage.Store` against a real SQLite file and a real PostgreSQL database (`store_url`, tests/conftest.py),
including concurrent writer processes."""

from __future__ import annotations

import csv
import io
import multiprocessing as mp
import sqlite3
import threading

import pytest
from sqlalchemy import text

from storage import Store, export_csv, lifecycle
from tests.helpers import put_in

SPEC = {"name": "demo", "action": "train", "model": "tiny", "dataset": {"source": "arithmetic", "num_prompts": 8},
        "rewards": [{"name": "exact_match", "weight": 1.0}], "config": {"beta": 0.5}, "peft": None}


def value_record(prompt_id: str, v_star: float | None = 0.5, prompt=None) -> dict:
    return {"prompt_id": prompt_id, "prompt": prompt or [{"role": "user", "content": f"what is {prompt_id}?"}],
            "prompt_text": f"what is {prompt_id}?", "v_star": v_star, "rewards": [1.0, 0.0],
            "completions": ["2", "3"], "num_correct": 1, "filtered": False}


def sample(step: int, prompt_id: str, reward: float = 1.0, completion: str = "4") -> dict:
    return {"step": step, "prompt_id": prompt_id, "prompt_text": f"What is 2+2? ({prompt_id})",
            "completion": completion, "reward": reward, "v_star": 0.5, "advantage": reward - 0.5,
            "implicit_reward": 0.1, "completion_length": 3, "split": "train"}


@pytest.fixture
def store(store_url) -> Store:
    return Store(store_url)


def test_pragmas(tmp_path):
    store = Store(tmp_path / "studio.db")  # SQLite's own settings
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with store._read() as s:  # the store's own connections
        conn = s.connection()
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 30_000


def queue_head(store: Store) -> dict:
    """The queued run that has waited longest: the one the scheduler admits first."""
    return min(store.list_runs(status="queued"), key=lambda r: (r["queued_at"], r["id"]))


def test_run_round_trip_and_queue_order(store):
    first = store.create_run("demo", "train", SPEC, model="tiny", dataset="arithmetic")
    second = store.create_run("other", "values", {**SPEC, "action": "values"})
    run = store.get_run(first)
    assert run["status"] == "queued" and run["config"] == SPEC and run["model"] == "tiny" and run["progress"] == 0
    assert [r["id"] for r in store.list_runs()] == [second, first]  # newest first
    assert [r["id"] for r in store.list_runs(status=["queued"])] == [second, first]
    assert queue_head(store)["id"] == first  # oldest first

    assert store.apply(first, lifecycle.CLAIM, pid=123)
    run = store.get_run(first)
    assert run["status"] == "running" and run["pid"] == 123 and run["started_at"] and run["heartbeat_at"]
    assert queue_head(store)["id"] == second

    store.update_run(first, stage="train", progress=0.5, output_dir="/tmp/x", error=None)
    before = store.get_run(first)["heartbeat_at"]
    store.heartbeat(first)
    assert store.get_run(first)["heartbeat_at"] >= before
    assert store.get_run(first)["progress"] == 0.5
    assert store.update_run(999, progress=1.0) is False
    assert store.get_run(999) is None

    # A resumed run goes to the back of the queue.
    assert store.apply(first, lifecycle.STOP)
    assert store.apply(first, lifecycle.RESUME)
    assert queue_head(store)["id"] == second


def test_bad_run_input_is_rejected_and_changes_nothing(store):
    run_id = store.create_run("demo", "train", SPEC)
    with pytest.raises(ValueError, match="Unknown run action"):
        store.create_run("x", "dance", SPEC)
    with pytest.raises(ValueError, match=r"\['status'\] change only through the run state machine"):
        store.update_run(run_id, status="finished", progress=1.0)
    with pytest.raises(ValueError, match="auto_resumes"):
        store.update_run(run_id, auto_resumes=0)
    with pytest.raises(ValueError, match="Unknown run field"):
        store.update_run(run_id, colour="red")
    assert store.get_run(run_id)["status"] == "queued" and store.get_run(run_id)["progress"] == 0
    assert len(store.list_runs()) == 1


@pytest.mark.slow
def test_claim_run_is_atomic_across_processes(store):
    run_id = store.create_run("demo", "train", SPEC)
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_claim, [(store.url, run_id, pid) for pid in range(8)])
    assert sum(results) == 1
    assert store.get_run(run_id)["pid"] in range(8)
    assert not store.apply(run_id, lifecycle.CLAIM, pid=99)


def _claim(path: str, run_id: int, pid: int) -> bool:
    return Store(path).apply(run_id, lifecycle.CLAIM, pid=pid)


def test_events_apply_only_from_their_source_statuses(store):
    run_id = store.create_run("demo", "train", SPEC)
    assert not store.apply(run_id, lifecycle.REQUEST_STOP)  # queued: nothing runs to stop
    assert store.get_run(run_id)["status"] == "queued"
    assert store.apply(run_id, lifecycle.CLAIM, pid=7) and store.apply(run_id, lifecycle.REQUEST_STOP)
    assert store.get_run(run_id)["status"] == "stopping"
    with pytest.raises(TypeError, match="not a storage.lifecycle event"):
        store.apply(run_id, "finish")


def test_counters_mean_what_the_state_machine_says(store):
    """`storage.lifecycle`: restarts in a row end with real progress; launch failures end with a claim; the time
    limit's clock starts again with a user's Resume; chunks and their seconds count for the whole life."""
    run_id = store.create_run("demo", "train", SPEC)
    assert store.apply(run_id, lifecycle.LAUNCH_RETRY) and store.apply(run_id, lifecycle.LAUNCH_RETRY)
    assert store.get_run(run_id)["launch_failures"] == 2
    store.apply(run_id, lifecycle.CLAIM, pid=1)
    assert store.get_run(run_id)["launch_failures"] == 0
    for _ in range(3):  # interrupted and resumed without progress in between
        store.apply(run_id, lifecycle.INTERRUPT)
        store.apply(run_id, lifecycle.AUTO_RESUME)
        store.apply(run_id, lifecycle.CLAIM, pid=1)
    run = store.get_run(run_id)
    assert run["auto_resumes"] == 3 and not lifecycle.may_auto_resume(run)
    store.record_progress(run_id, stage="train", progress=0.2)
    run = store.get_run(run_id)
    assert run["auto_resumes"] == 0 and lifecycle.may_auto_resume(run) and run["progress_at"]
    store.update_run(run_id, started_at=run["started_at"] - 100)  # worked 100 s
    assert store.apply(run_id, lifecycle.YIELD, seconds=2.5)
    run = store.get_run(run_id)
    assert run["status"] == "queued" and run["chunks_done"] == 1 and run["chunk_seconds"] == 2.5
    assert run["limit_seconds"] >= 100
    store.apply(run_id, lifecycle.CLAIM, pid=1)
    store.apply(run_id, lifecycle.REQUEST_STOP, stop_reason="limit")
    store.apply(run_id, lifecycle.STOP)
    assert store.apply(run_id, lifecycle.RESUME)
    run = store.get_run(run_id)
    assert run["limit_seconds"] == 0 and run["chunks_done"] == 1 and run["auto_resumes"] == 0
    assert run["stop_reason"] is None and run["error"] is None


def test_value_sets_and_idempotent_values(store):
    meta = {"model": "tiny", "dataset": "arithmetic", "num_value_samples": 2}
    vs = store.get_or_create_value_set("fp-1", meta)
    assert store.get_or_create_value_set("fp-1", {"ignored": True}) == vs
    assert store.find_value_set("fp-1")["meta"] == meta and store.find_value_set("nope") is None
    assert store.add_values(vs, "train", [value_record("a"), value_record("b", v_star=None)]) == 2
    # Re-adding: no duplicates, the stored estimate is kept, a missing one is filled in.
    assert store.add_values(vs, "train", [value_record("a", v_star=0.9), value_record("b", v_star=0.25)]) == 0
    assert store.add_values(vs, "eval", [value_record("a", prompt="plain prompt")]) == 1
    rows = store.get_values(vs, "train")
    assert [(r["prompt_id"], r["v_star"]) for r in rows] == [("a", 0.5), ("b", 0.25)]
    assert rows[0]["rewards"] == [1.0, 0.0] and rows[0]["completions"] == ["2", "3"]
    assert rows[0]["prompt"] == [{"role": "user", "content": "what is a?"}] and rows[0]["num_correct"] == 1
    assert store.count_values(vs, "train") == 2 and store.count_values(vs, None) == 3
    assert store.value_splits(vs) == ["eval", "train"]

    store.mark_value_set_complete(vs, {"train": {"mean_v_star": 0.375}})
    found = store.find_value_set("fp-1")
    assert found["complete"] is True and found["summary"]["train"]["mean_v_star"] == 0.375
    assert found["num_values"] == 3
    assert [v["id"] for v in store.list_value_sets()] == [vs]

    with pytest.raises(ValueError, match="prompt_id"):
        store.add_values(vs, "train", [{"v_star": 1.0}])
    assert store.count_values(vs, "train") == 2


def test_metrics_upsert_and_polling(store):
    run_id = store.create_run("demo", "train", SPEC)
    assert store.last_ids(run_id)["metrics"] == 0
    assert store.add_metrics(run_id, 1, {"loss": 1.5, "reward": 0.25, "note": "text", "flag": True}) == 2
    first = store.get_metrics(run_id)
    assert [(m["step"], m["name"], m["value"]) for m in first] == [(1, "loss", 1.5), (1, "reward", 0.25)]
    last_id = store.last_ids(run_id)["metrics"]
    store.add_metrics(run_id, 1, {"loss": 1.25})  # re-logged step: updated in place
    store.add_metrics(run_id, 2, {"loss": float("nan"), "reward": 0.5})
    new = store.get_metrics(run_id, after_id=last_id)
    assert [(m["step"], m["name"], m["value"]) for m in new] == [(2, "loss", None), (2, "reward", 0.5)]
    assert len(store.get_metrics(run_id)) == 4
    assert store.get_metrics(run_id, names=["loss"])[0]["value"] == 1.25
    assert store.metric_names(run_id) == ["loss", "reward"]


def test_samples_filters_and_idempotence(store):
    run_id = store.create_run("demo", "train", SPEC)
    store.add_samples(run_id, [sample(1, "a"), sample(1, "b", reward=0.0, completion="5")])
    store.add_samples(run_id, [sample(1, "a"), sample(2, "a", completion="100%_x")])
    rows = store.get_samples(run_id)
    assert [(r["step"], r["prompt_id"]) for r in rows] == [(1, "a"), (1, "b"), (2, "a")]
    assert {r["prompt_id"] for r in store.get_samples(run_id, correct=False)} == {"b"}
    assert len(store.get_samples(run_id, correct=True)) == 2
    assert [r["completion"] for r in store.get_samples(run_id, text="100%_")] == ["100%_x"]
    assert len(store.get_samples(run_id, text="what is 2+2")) == 3  # prompt text, case-insensitive
    assert len(store.get_samples(run_id, step=1)) == 2
    assert len(store.get_samples(run_id, after_id=rows[1]["id"])) == 1
    assert store.get_samples(run_id, limit=1, newest_first=True)[0]["step"] == 2
    # A search text past the store's bound is refused naming it, before any SQL (SQLite refuses LIKE patterns past
    # 50,000 bytes with the whole statement in its message); an id no row can have finds nothing.
    with pytest.raises(ValueError, match="search for at most 500"):
        store.get_samples(run_id, text="a" * 60_000)
    assert store.get_run(10**30) is None and store.get_run(-1) is None and store.get_run("x") is None


def test_evaluations_checkpoints_logs(store):
    run_id = store.create_run("demo", "train", SPEC)
    store.add_evaluation(run_id, 2, {"eval_accuracy": 0.25, "eval_loss": 1.0})
    store.add_evaluation(run_id, 4, {"eval_accuracy": 0.5, "eval_loss": float("nan")})
    store.add_evaluation(run_id, 4, {"eval_accuracy": 0.5, "eval_loss": 0.5})  # same step: updated, not doubled
    store.add_evaluation(run_id, 6, {"eval_accuracy": 0.125})
    evals = store.get_evaluations(run_id)
    assert [e["step"] for e in evals] == [2, 4, 6] and evals[1]["metrics"]["eval_loss"] == 0.5
    assert store.get_run(run_id)["best_eval_accuracy"] == 0.5

    assert store.latest_checkpoint(run_id) is None
    store.add_checkpoint(run_id, 2, "/out/checkpoint-2")
    store.add_checkpoint(run_id, 4, "/out/checkpoint-4")
    store.add_checkpoint(run_id, 4, "/out/checkpoint-4")
    assert store.latest_checkpoint(run_id)["path"] == "/out/checkpoint-4"
    assert len(store.list_checkpoints(run_id)) == 2

    store.add_log(run_id, "hello")
    store.add_logs(run_id, [("warning", "careful"), ("error", "boom")])
    logs = store.get_logs(run_id)
    assert [(r["level"], r["message"]) for r in logs] == [("INFO", "hello"), ("WARNING", "careful"), ("ERROR", "boom")]
    assert [r["message"] for r in store.get_logs(run_id, after_id=logs[0]["id"], limit=1)] == ["careful"]
    assert store.last_ids(run_id) == {"metrics": 0, "samples": 0, "logs": logs[-1]["id"],
                                      "evaluations": evals[-1]["id"], "checkpoints": 2}


def test_delete_run_cascades_but_keeps_value_set(store):
    vs = store.get_or_create_value_set("fp", {})
    store.add_values(vs, "train", [value_record("a")])
    keep, gone = (store.create_run(name, "train", SPEC) for name in ("keep", "gone"))
    for run_id in (keep, gone):
        store.update_run(run_id, value_set_id=vs)
        store.add_metrics(run_id, 1, {"loss": 1.0})
        store.add_samples(run_id, [sample(1, "a")])
        store.add_evaluation(run_id, 1, {"eval_accuracy": 1.0})
        store.add_checkpoint(run_id, 1, f"/out/{run_id}")
        store.add_log(run_id, "x")
    child = store.create_run("resumed", "train", SPEC, parent_run_id=gone)
    assert store.delete_run(gone)
    assert not store.delete_run(gone)
    assert store.get_run(gone) is None and store.get_run(child)["parent_run_id"] is None
    for getter in (store.get_metrics, store.get_samples, store.get_evaluations, store.get_logs,
                   store.list_checkpoints):
        assert getter(gone) == [] and len(getter(keep)) == 1
    assert store.count_values(vs) == 1
    with store._read() as s:  # nothing orphaned in the database itself
        for table in ("metrics", "samples", "evaluations", "checkpoints", "logs", "metric_latest", "run_values"):
            assert s.execute(text(f"SELECT count(*) FROM {table} WHERE run_id = :run"), {"run": gone}).scalar() == 0


def test_export_csv(store):
    run_id = store.create_run("demo", "train", SPEC)
    store.add_metrics(run_id, 1, {"loss": 1.0})
    vs = store.get_or_create_value_set("fp", {})
    store.add_values(vs, "train", [value_record("a")])
    metrics = list(csv.DictReader(io.StringIO(export_csv(store.get_metrics(run_id)))))
    assert metrics[0]["name"] == "loss" and float(metrics[0]["value"]) == 1.0
    values = list(csv.DictReader(io.StringIO(export_csv(store.get_values(vs)))))
    assert values[0]["rewards"] == "[1.0, 0.0]"
    assert export_csv([]) == "\n"


def _write_metrics(path: str, run_id: int, steps: int) -> None:
    store = Store(path)
    for step in range(steps):
        store.add_metrics(run_id, step, {"loss": 1.0 / (step + 1), "reward": step % 2})
        store.add_samples(run_id, [sample(step, "a")])
        store.heartbeat(run_id)


@pytest.mark.slow
def test_concurrent_writers_and_reader_never_lock(store):
    run_id = store.create_run("demo", "train", SPEC)
    other = store.create_run("other", "train", SPEC)
    ctx = mp.get_context("spawn")
    writers = [ctx.Process(target=_write_metrics, args=(store.url, rid, 150)) for rid in (run_id, other)]
    for w in writers:
        w.start()
    seen, reads = 0, 0
    while any(w.is_alive() for w in writers) or reads == 0:
        rows = store.get_metrics(run_id, after_id=seen)  # polling like the UI
        seen = rows[-1]["id"] if rows else seen
        store.list_runs()
        store.add_log(run_id, "ui wrote too")  # the UI process writes as well
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert len(store.get_metrics(run_id)) == 300 and len(store.get_metrics(other)) == 300
    assert len(store.get_samples(run_id, limit=None)) == 150


def test_store_survives_fork_and_threads(store):
    run_id = store.create_run("demo", "train", SPEC)
    store.add_metrics(run_id, 0, {"loss": 1.0})  # opens connections in the parent before forking
    proc = mp.get_context("fork").Process(target=_write_with_inherited, args=(store, run_id))
    proc.start()
    threads = [threading.Thread(target=store.add_metrics, args=(run_id, step, {"acc": 0.5})) for step in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proc.join()
    assert proc.exitcode == 0
    assert len(store.get_metrics(run_id)) == 1 + 5 + 20


def _write_with_inherited(store: Store, run_id: int) -> None:
    for step in range(20):
        store.add_metrics(run_id, 100 + step, {"loss": 0.5})


def test_create_run_counts_its_limits_in_the_inserting_transaction(store):
    from storage import Admission, LimitReached

    per_owner = Admission(per_owner=2)
    first = store.create_run("a", "train", SPEC, owner="ann", admission=per_owner)
    store.create_run("b", "train", SPEC, owner="ann", admission=per_owner)
    with pytest.raises(LimitReached) as full:
        store.create_run("c", "train", SPEC, owner="ann", admission=per_owner)
    assert (full.value.what, full.value.count, full.value.limit) == ("owner", 2, 2)
    assert len(store.list_runs()) == 2  # nothing stored for the refused run
    store.create_run("d", "train", SPEC, owner="bob", admission=per_owner)  # another owner's count
    store.create_run("e", "train", SPEC, admission=per_owner)  # no owner: no per-owner limit
    put_in(store, first, "finished")  # an ended run no longer counts
    store.create_run("f", "train", SPEC, owner="ann", admission=per_owner)

    with pytest.raises(LimitReached) as full:
        store.create_run("g", "train", SPEC, admission=Admission(queue_size=4))
    assert (full.value.what, full.value.count) == ("queue", 4)

    # Threads racing on one file: the count and the insert are one transaction, so exactly the limit gets in.
    barrier, refused = threading.Barrier(8), []

    def launch() -> None:
        barrier.wait()
        try:
            store.create_run("race", "train", SPEC, owner="cy", admission=Admission(per_owner=3))
        except LimitReached:
            refused.append(1)

    threads = [threading.Thread(target=launch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == 5 and len([r for r in store.list_runs() if r["owner"] == "cy"]) == 3
