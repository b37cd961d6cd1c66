"""The one write contract (`storage.writes`): `Store` and a chunk's `ChunkLedger` take every write of a run's worker
with the same signature, and a journal replays into the rows the store writes directly."""

from __future__ import annotations

import inspect
import os

import pytest

from app.runtime import chunks, journal
from storage import Store, lifecycle, writes
from storage.writes import RunWriter, WorkerStore

SPEC = {"name": "demo", "action": "train", "model": "tiny", "dataset": {"source": "arithmetic"}}


def declared(protocol: type) -> list[str]:
    return [name for name, member in vars(protocol).items() if callable(member) and not name.startswith("_")]


def test_the_store_and_a_chunk_ledger_list_the_same_writes_with_the_same_signatures(tmp_path):
    assert declared(RunWriter) == list(writes.WRITES)  # one table, one declaration, in one order
    store = Store(tmp_path / "studio.db")
    run_id = store.create_run("demo", "train", SPEC)
    journal.write_input(store, tmp_path, store.get_run(run_id))
    ledger = journal.ChunkLedger(tmp_path, run_id)
    try:
        assert isinstance(store, WorkerStore) and isinstance(ledger, WorkerStore)
        for name in [*declared(RunWriter), *declared(WorkerStore)]:
            contract = inspect.signature(getattr(WorkerStore, name))
            assert inspect.signature(getattr(Store, name)) == contract, f"Store.{name}"
            assert inspect.signature(getattr(journal.ChunkLedger, name)) == contract, f"ChunkLedger.{name}"
        for name, write in writes.WRITES.items():
            # The function a journal replays: a transaction, the method's own parameters, then when it happened.
            session, *own = inspect.signature(write.function).parameters.values()
            assert [p for p in own if p.name != "at"] == list(writes.signature(name).parameters.values()), name
    finally:
        ledger.close()
        store.close()


def every_write(writer: WorkerStore, run_id: int, value_set_id: int, folder: str) -> None:
    """Each write of `RunWriter` once (and a checkpoint removed), as a worker makes them."""
    record = {"prompt_id": "p1", "prompt": [{"role": "user", "content": "1+1?"}], "v_star": 0.5,
              "rewards": [1.0, 0.0], "completions": ["2", "3"], "num_correct": 1, "filtered": False}
    writer.update_run(run_id, stage="values", output_dir=folder)
    writer.heartbeat(run_id, progress=0.1)
    writer.record_progress(run_id, stage="train", progress=0.5)
    writer.add_values(value_set_id, "train", [record, {**record, "prompt_id": "p2", "v_star": None}],
                      seconds=2.0, tokens=12)
    writer.set_run_values(run_id, "train", [{"prompt_id": "p1", "v_star": 0.25, "num_correct": 1, "filtered": True}])
    writer.update_value_set_summary(value_set_id, {"train": {"mean_v_star": 0.5}})
    writer.mark_value_set_complete(value_set_id, {"train": {"mean_v_star": 0.5}, "eval": {}})
    assert writer.add_metrics(run_id, 3, {"loss": 0.75, "reward": 1, "note": "text", "flag": True}) == 2
    writer.add_samples(run_id, [{"step": 3, "prompt_id": "p1", "prompt_text": "1+1?", "completion": "2",
                                 "reward": 1.0, "advantage": 0.5}])
    writer.add_evaluation(run_id, 3, {"eval_accuracy": 0.75, "eval_runtime": 1.5})
    writer.add_checkpoint(run_id, 2, f"{folder}/checkpoint-2")
    writer.add_checkpoint(run_id, 3, f"{folder}/checkpoint-3")
    assert writer.remove_checkpoint(run_id, f"{folder}/checkpoint-2")
    writer.add_log(run_id, "one line", level="WARNING")
    writer.add_logs(run_id, [("INFO", "two"), ("ERROR", "three")])
    assert writer.apply(run_id, lifecycle.REQUEST_STOP)


def recorded(store: Store, run_id: int) -> dict:
    """What the writes left of a run and its value set, without ids, names and clocks."""
    run = store.get_run(run_id)

    def strip(rows, *drop):
        return [{k: v for k, v in row.items() if k not in {"id", "run_id", "created_at", *drop}} for row in rows]

    value_set = store.get_value_set(run["value_set_id"])
    return {
        "run": {k: run[k] for k in ("status", "stage", "progress", "auto_resumes", "best_eval_accuracy",
                                    "value_counts", "values_revision")},
        "metrics": strip(store.get_metrics(run_id), "metric_id"),
        "samples": strip(store.get_samples(run_id)),
        "evaluations": strip(store.get_evaluations(run_id)),
        "checkpoints": [(c["step"], os.path.basename(c["path"])) for c in store.list_checkpoints(run_id)],
        "logs": [(line["level"], line["message"]) for line in store.get_logs(run_id)],
        "value_set": {k: value_set[k] for k in ("complete", "summary", "counts", "cost")},
        "values": strip(store.get_values(run["value_set_id"], None), "value_set_id"),
        "run_values": strip(store.iter_values(run_id), "value_set_id"),
    }


def test_a_journal_replays_every_write_into_the_rows_the_store_writes(tmp_path, store_url):
    store = Store(store_url)
    data = tmp_path / "data"
    runs = {}
    for name in ("direct", "chunked"):
        run_id = store.create_run(name, "train", SPEC)
        store.update_run(run_id, value_set_id=store.get_or_create_value_set(f"fp-{name}", {}))
        assert store.apply(run_id, lifecycle.CLAIM, pid=os.getpid())
        runs[name] = store.get_run(run_id)
    direct, chunked = runs["direct"], runs["chunked"]
    every_write(store, direct["id"], direct["value_set_id"], str(tmp_path / "direct"))
    journal.write_input(store, data, chunked)
    ledger = journal.ChunkLedger(data, chunked["id"])
    every_write(ledger, chunked["id"], chunked["value_set_id"], str(tmp_path / "chunked"))
    ledger.close()
    assert store.get_run(chunked["id"])["status"] == lifecycle.RUNNING  # nothing reached the database yet
    chunks.ingest(store, data, chunked["id"])
    assert recorded(store, chunked["id"]) == recorded(store, direct["id"])
    assert recorded(store, direct["id"])["run"]["status"] == lifecycle.STOPPING
    store.close()


def test_a_write_that_does_not_fit_its_signature_is_refused_before_anything_is_written(tmp_path):
    store = Store(tmp_path / "studio.db")
    run_id, other = (store.create_run(name, "train", SPEC) for name in ("mine", "other"))
    assert store.apply(run_id, lifecycle.CLAIM, pid=os.getpid())
    journal.write_input(store, tmp_path, store.get_run(run_id))
    ledger = journal.ChunkLedger(tmp_path, run_id)
    with pytest.raises(ValueError, match="parent settles 'finish'"):
        ledger.apply(run_id, lifecycle.FINISH)
    with pytest.raises(ValueError, match=f"journal of run {run_id} takes no write of run {other}"):
        ledger.add_metrics(other, 1, {"loss": 1.0})
    ledger.close()
    assert ledger.path.read_text() == ""

    # A journal line that no write takes: named, with the signature it should fit, and nothing applied.
    bad = [("add_metrics", {"run_id": run_id, "step": 1, "metrics": {"loss": 1.0}}),
           ("add_metrics", {"run_id": run_id, "stepp": 2, "metrics": {"loss": 2.0}})]
    with pytest.raises(ValueError, match=r"'add_metrics' does not fit RunWriter.add_metrics\(run_id, step, metrics\)"):
        store.apply_journal(run_id, bad, offset=100)
    for ops, problem in ([("add_metric", {"run_id": run_id})], "Unknown journal write 'add_metric'"), \
                        ([("add_log", {"run_id": other, "message": "x"})], f"run {run_id} holds a write of run"), \
                        ([("apply", {"run_id": run_id, "event": "finish"})], "only the events request_stop"):
        with pytest.raises(ValueError, match=problem):
            store.apply_journal(run_id, ops, offset=100)
    assert store.get_metrics(run_id) == [] and store.get_logs(other) == []
    assert store.get_run(run_id)["journal_offset"] == 0 and store.get_run(run_id)["status"] == lifecycle.RUNNING
    store.close()


def test_a_journal_written_before_the_contract_is_still_applied(tmp_path):
    """A studio upgraded while a chunk's journal waits: lines without `run_id`, and a stop as `request_stop`."""
    store = Store(tmp_path / "studio.db")
    run_id = store.create_run("old", "train", SPEC)
    assert store.apply(run_id, lifecycle.CLAIM, pid=os.getpid())
    old = [("add_metrics", {"step": 1, "metrics": {"loss": 1.5}, "at": 1.0}),
           ("add_logs", {"lines": [["INFO", "from an old chunk"]], "at": 1.0}),
           ("request_stop", {"at": 2.0})]
    assert store.apply_journal(run_id, old, offset=3)
    assert [(m["step"], m["name"], m["value"]) for m in store.get_metrics(run_id)] == [(1, "loss", 1.5)]
    assert "from an old chunk" in [line["message"] for line in store.get_logs(run_id)]
    assert store.get_run(run_id)["status"] == lifecycle.STOPPING
    store.close()
