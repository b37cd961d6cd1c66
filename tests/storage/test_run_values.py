"""Each run's pages show the V* and the kept/filtered split that run trained with.

A value set holds the reference samples of every run with the same model, data, rewards, sampling settings and
seed, stored once; beta1 and `filter_all_incorrect` are not part of it: each run recomputes V* and the filter
from the stored rewards. What a run trained with is its own rows (`run_values`), which the V* tab, the Filtered
tab, the exports, `/status` and the playground read.

The store's own rules first, on hand-built rows; then runs of the tiny model taught half the answers (its
samples are sometimes right) through the real app (its scheduler, worker processes, chunks and API): a first run
with beta1 = 0.5 that keeps every prompt, a second with beta1 = 0.1 that drops the prompts no sample solved.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os

import pytest
import torch

from a2po.core import optimal_value
from app.access.gate import Services
from app.runtime import chunks, journal
from app.web import live
from app.web.pages import compare, values
from app.web.pages.export import write_csv
from app.web.pages.run.frame import ChartOptions
from app.web.pages.run.session import new_state, refresh
from app.web.pages.run.views import OUTPUTS
from storage import Store, lifecycle
from tests import helpers
from tests.runtime.test_chunks import chunk_spec, taught_model  # noqa: F401 - a fixture
from tests.web.test_app_api import free_port, start_app, stop_app

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow]
wait_for = functools.partial(helpers.wait_for, poll=0.2)
SPEC = {"name": "v", "action": "train", "model": "tiny", "dataset": {"source": "arithmetic", "num_prompts": 4}}
INPUTS = (ChartOptions(), "train", "V* (highest first)", "", "all", "", "")
N = 4  # reference samples per prompt in the runs below


def hand_v_star(k: int, n: int, beta1: float) -> float:
    """V* of k correct out of n binary rewards, by hand: beta1 * log((k e^(1/beta1) + n - k) / n)."""
    return beta1 * math.log((k * math.exp(1 / beta1) + (n - k)) / n)


def record(i: int, correct: int, beta1: float = 0.5, filter_all: bool = False) -> dict:
    rewards = [1.0] * correct + [0.0] * (N - correct)
    return {"prompt_id": f"p{i}", "prompt": f"What is {i} + {i}?", "prompt_text": f"What is {i} + {i}?",
            "v_star": hand_v_star(correct, N, beta1), "rewards": rewards,
            "completions": [f"answer {j} of {i}" for j in range(N)], "num_correct": correct,
            "filtered": filter_all and correct == 0}


# ------------------------------------------------------------------ the store's rules


@pytest.fixture
def store(store_url) -> Store:
    return Store(store_url)  # a SQLite file, then a PostgreSQL database


def two_runs(store: Store) -> tuple[int, int, int]:
    """A value set of 4 prompts (0, 1, 2, 4 correct of 4) sampled by a first run (beta1 0.5, every prompt kept),
    reused by a second (beta1 0.1, unsolved prompts dropped). Returns (value set, first run, second run)."""
    vs = store.get_or_create_value_set("fp", {})
    first, second = (store.create_run(name, "train", SPEC) for name in ("first", "second"))
    for run_id in (first, second):
        store.update_run(run_id, value_set_id=vs)
    correct = [0, 1, 2, 4]
    store.add_values(vs, "train", [record(i, k) for i, k in enumerate(correct)])
    store.set_run_values(first, "train", [record(i, k) for i, k in enumerate(correct)])
    # The second run's sampling finds every prompt stored: the shared rows stay as they are, its own are new.
    assert store.add_values(vs, "train", [record(i, k, 0.1, True) for i, k in enumerate(correct)]) == 0
    store.set_run_values(second, "train", [record(i, k, 0.1, True) for i, k in enumerate(correct)], replace=True)
    return vs, first, second


def test_two_runs_of_one_value_set_each_read_their_own_v_star(store):
    vs, first, second = two_runs(store)
    assert len(store.get_values(vs, None)) == 4  # the reference samples, once
    for run_id, beta1, filtered in ((first, 0.5, []), (second, 0.1, ["p0"])):
        rows = list(store.iter_values(run_id))
        assert [r["v_star"] for r in rows] == pytest.approx([hand_v_star(k, N, beta1) for k in (0, 1, 2, 4)])
        assert [r["prompt_id"] for r in rows if r["filtered"]] == filtered
        assert rows[1]["completions"] == [f"answer {j} of 1" for j in range(N)] and rows[1]["num_correct"] == 1
        one = store.get_value(run_id, "train", "p1")
        assert one["v_star"] == pytest.approx(hand_v_star(1, N, beta1)) and one["rewards"] == [1.0, 0.0, 0.0, 0.0]
        stats = store.value_stats(run_id, "train")
        assert stats["count"] == 4 and stats["filtered"] == len(filtered)
        assert stats["mean_v_star"] == pytest.approx(sum(hand_v_star(k, N, beta1) for k in (0, 1, 2, 4)) / 4)
        assert sum(stats["histogram"]["filtered"]) == len(filtered)
        page = store.values_page(run_id, "train", sort="v_star", descending=True)
        assert [r["prompt_id"] for r in page] == ["p3", "p2", "p1", "p0"]
        assert [r["prompt_id"] for r in store.values_page(run_id, "train", filtered=True)] == filtered
        assert [r["prompt_id"] for r in store.values_page(run_id, "train", text="1 + 1")] == ["p1"]
        assert [r["v_star"] for r in store.values_after(run_id, "train")] == [r["v_star"] for r in rows]
        summary = store.value_summary(run_id)["train"]
        assert summary["num_prompts"] == 4 and summary["num_filtered"] == len(filtered)
        assert summary["mean_v_star"] == pytest.approx(stats["mean_v_star"])
        assert summary["pass_at_1"] == pytest.approx(7 / 16) and summary["pass_at_n"] == pytest.approx(3 / 4)
        assert summary["num_value_samples"] == N
        assert store.get_run(run_id)["value_counts"] == {"train": 4}
    assert hand_v_star(1, 4, 0.5) == pytest.approx(0.4772, abs=1e-4)  # the figures
    assert hand_v_star(1, 4, 0.1) == pytest.approx(0.8614, abs=1e-4)


def test_the_counts_and_the_revision_follow_the_run_rows(store):
    vs, first, second = two_runs(store)
    before = store.get_run(first)
    # Writing the same rows again changes nothing; rows added after the last ones move the count only.
    assert store.set_run_values(first, "train", [record(i, k) for i, k in enumerate([0, 1, 2, 4])]) == 0
    store.add_values(vs, "train", [record(9, 3)])
    assert store.set_run_values(first, "train", [record(9, 3)]) == 1
    after = store.get_run(first)
    assert after["value_counts"] == {"train": 5} and after["values_revision"] == before["values_revision"]
    # A changed row moves the revision (a page that followed the new rows only would miss it) ...
    store.set_run_values(first, "train", [record(9, 3, beta1=0.2)])
    assert store.get_run(first)["values_revision"] == after["values_revision"] + 1
    # ... and the whole table replaces the run's rows of the split.
    store.set_run_values(first, "train", [record(0, 0), record(9, 3)], replace=True)
    assert store.get_run(first)["value_counts"] == {"train": 2}
    assert [r["prompt_id"] for r in store.iter_values(first)] == ["p0", "p9"]
    # A row without a shared one (a V* the dataset gave) is not the run's: the pages show stored samples.
    assert store.set_run_values(first, "eval", [{"prompt_id": "given", "v_star": 0.9}]) == 0
    with pytest.raises(ValueError, match="count the run's V\\* rows"):
        store.update_run(first, value_counts={})
    assert store.get_run(second)["value_counts"] == {"train": 4}  # the other run is untouched
    # A deleted run takes its rows; the shared ones stay, with the other run's.
    assert store.delete_run(first)
    assert len(store.get_values(vs, None)) == 5 and len(list(store.iter_values(second))) == 4


def test_a_chunk_journals_the_run_rows_as_the_store_writes_them(tmp_path, store_url):
    """What a chunk's recorder writes goes through its journal (`ChunkLedger`, then `Store.apply_journal`) into
    the same rows as a worker's direct writes."""
    from app.runtime.recorder import StoreRecorder

    data = tmp_path / "data"
    store = Store(store_url)
    vs = store.get_or_create_value_set("fp", {})
    direct, chunked = (store.create_run(name, "train", SPEC) for name in ("direct", "chunked"))
    for run_id in (direct, chunked):
        store.update_run(run_id, value_set_id=vs)
    batch = [record(i, k, 0.1, True) for i, k in enumerate([0, 1])]
    table = [record(i, k, 0.1, True) for i, k in enumerate([0, 1, 3])]
    StoreRecorder(store, direct, vs).on_values_batch(None, None, _Control(), split="train", records=batch, done=2,
                                                     total=3)
    store.apply(chunked, lifecycle.CLAIM, pid=os.getpid())
    journal.write_input(store, data, store.get_run(chunked))
    ledger = journal.ChunkLedger(data, chunked)
    recorder = StoreRecorder(ledger, chunked, vs)
    recorder.on_values_batch(None, None, _Control(), split="train", records=batch, done=2, total=3)
    store.add_values(vs, "train", table)  # the direct run's last batch
    recorder.on_values_batch(None, None, _Control(), split="train", records=table[2:], done=3, total=3)
    ledger.close()
    chunks.ingest(store, data, chunked)
    StoreRecorder(store, direct, vs).on_values_end(None, None, _Control(), split="train", values=_table(table),
                                                   summary={})
    ledger = journal.ChunkLedger(data, chunked)
    StoreRecorder(ledger, chunked, vs).on_values_end(None, None, _Control(), split="train", values=_table(table),
                                                     summary={})
    ledger.close()
    chunks.ingest(store, data, chunked)
    assert "set_run_values" in (journal.journal_path(data, chunked).read_text())
    mine = [{k: r[k] for k in ("prompt_id", "v_star", "num_correct", "filtered")} for r in store.iter_values(chunked)]
    assert mine == [{k: r[k] for k in ("prompt_id", "v_star", "num_correct", "filtered")}
                    for r in store.iter_values(direct)]
    assert [r["filtered"] for r in mine] == [True, False, False] and len(store.get_values(vs, None)) == 3
    assert store.get_run(chunked)["value_counts"] == store.get_run(direct)["value_counts"] == {"train": 3}


class _Control:
    should_training_stop = False


def _table(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows)


# ------------------------------------------------------------------ real runs through the app


def check_run(store: Store, services: Services, run_id: int, beta1: float, filter_all: bool,
              monkeypatch) -> dict:
    """Every view of the run against what it trained with, computed by hand from the stored reference rewards
    with its own beta1 and filter; returns those values by (split, prompt id)."""
    monkeypatch.setattr(live, "SHARED", live.Shared())
    shared = {(r["split"], r["prompt_id"]): r for r in store.get_values(store.get_run(run_id)["value_set_id"], None)}
    assert len(shared) == 12 + 4
    truth = {}
    for key, row in shared.items():
        k = sum(r >= 1.0 - 1e-6 for r in row["rewards"])
        assert row["num_correct"] == k and len(row["rewards"]) == N
        v_star = float(optimal_value(torch.tensor([row["rewards"]]), beta1)[0])
        assert v_star == pytest.approx(hand_v_star(k, N, beta1), abs=1e-9)
        truth[key] = {"v_star": v_star, "num_correct": k, "filtered": filter_all and k == 0}
    train = [v for (split, _), v in truth.items() if split == "train"]
    dropped = sorted(pid for (split, pid), v in truth.items() if split == "train" and v["filtered"])
    mean = sum(v["v_star"] for v in train) / len(train)

    # Stage 2 trained with these values: each training sample carries its prompt's V*, no dropped prompt. The
    # Explain page draws these samples (targets r - V*) and the held-out ones (V* = 0: none of its samples right).
    samples = store.get_samples(run_id, split="train", limit=None)
    assert samples and all(s["prompt_id"] not in dropped for s in samples)
    for sample in samples:
        assert sample["v_star"] == pytest.approx(truth["train", sample["prompt_id"]]["v_star"], abs=1e-6)
    held_out = store.get_samples(run_id, split="eval", limit=None)
    assert held_out
    for sample in held_out:
        assert sample["v_star"] == pytest.approx(truth["eval", sample["prompt_id"]]["v_star"], abs=1e-6)

    # The V* tab: its summary, the table (sorted by V*) and one prompt's detail.
    out = dict(zip(OUTPUTS, refresh(services, run_id, new_state(run_id, "values"), *INPUTS),
                   strict=True))
    table = out["table"]
    assert list(table["V*"]) == sorted((round(v["v_star"], 4) for v in train), reverse=True)
    assert sorted(table.loc[table["filtered"], "prompt_id"]) == dropped
    assert f"mean V* {mean:.3f}" in out["summary"] and f"**{len(dropped):,} filtered**" in out["summary"]
    pid, some = next((pid, v) for (split, pid), v in truth.items() if split == "train" and 0 < v["num_correct"] < N)
    text, _ = values.prompt_detail(store.get_value(run_id, "train", pid), pid)
    assert f"V* = {hand_v_star(some['num_correct'], N, beta1):.4f}" in text
    # The Filtered tab.
    out = dict(zip(OUTPUTS, refresh(services, run_id, new_state(run_id, "filtered"), *INPUTS),
                   strict=True))
    assert sorted(out["filtered_table"]["prompt_id"]) == dropped
    assert (f"**{len(dropped)} of 12 prompts dropped**" in out["filtered_summary"] if dropped
            else out["filtered_summary"] == "No prompt was filtered.")
    # The export.
    exported = list(csv.DictReader(io.StringIO(write_csv(services, "values", run_id).read_text())))
    assert len(exported) == len(truth)
    for line in exported:
        expected = truth[line["split"], line["prompt_id"]]
        assert float(line["v_star"]) == pytest.approx(expected["v_star"]), line["prompt_id"]
        assert line["filtered"] == str(expected["filtered"]) and int(line["num_correct"]) == expected["num_correct"]
        assert line["completions"] == json.dumps(shared[line["split"], line["prompt_id"]]["completions"])
    # The Compare page's curves: the run logged its own stage-1 figures.
    logged = store.latest_metrics(run_id)
    assert logged["values/train/mean_v_star"]["value"] == pytest.approx(mean, abs=1e-6)
    assert logged["values/train/num_filtered"]["value"] == len(dropped)
    return truth


def check_rows(store: Store, run_id: int, truth: dict) -> None:
    """The store's own reads of the run's rows, and their counts on the run."""
    rows = {(r["split"], r["prompt_id"]): r for r in store.iter_values(run_id)}
    assert set(rows) == set(truth)
    for key, row in rows.items():
        assert row["v_star"] == pytest.approx(truth[key]["v_star"]) and row["filtered"] == truth[key]["filtered"]
    assert store.get_run(run_id)["value_counts"] == {"train": 12, "eval": 4}


def check_status(client, run_id: int, truth: dict) -> None:
    """`/status`'s V* summary: the run's own figures."""
    status = client.predict(run_id=run_id, api_name="/status")["values"]
    train = [v for (split, _), v in truth.items() if split == "train"]
    summary = status["summary"]["train"]
    assert summary["mean_v_star"] == pytest.approx(sum(v["v_star"] for v in train) / 12)
    assert summary["num_filtered"] == sum(v["filtered"] for v in train)
    assert summary["num_prompts"] == 12 and summary["num_value_samples"] == N and status["num_prompts"] == 16


def value_spec(model: str, name: str, beta1: float, filter_all: bool, runner: str) -> dict:
    return chunk_spec(model, name, runner, num_value_samples=N, temperature=1.0, max_steps=2, save_steps=0,
                      beta1=beta1, filter_all_incorrect=filter_all)


def launch_and_wait(client, store: Store, spec: dict) -> int:
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    finished = helpers.wait_status(store, run_id, ("finished", "failed", "stopped"), timeout=400)
    assert finished["status"] == "finished", finished["error"]
    return run_id


@pytest.mark.parametrize("runner", ["worker", "chunked"])
def test_a_second_run_with_another_beta1_shows_the_v_star_it_trained_with(tmp_path, taught_model,  # noqa: F811
                                                                          runner, monkeypatch):
    from gradio_client import Client

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # see tests/runtime/test_chunks.py: the app itself never runs torch
    port = free_port()
    data = tmp_path / "studio"
    proc = start_app(data, port, "--model-root", taught_model, "--chunk-seconds", "0.5")
    store = None
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        store = Store(data / "studio.db")
        services = Services(store=store, scheduler=None, data_dir=data)
        first = launch_and_wait(client, store, value_spec(taught_model, "first", 0.5, False, runner))
        truth_first = check_run(store, services, first, 0.5, False, monkeypatch)
        second = launch_and_wait(client, store, value_spec(taught_model, "second", 0.1, True, runner))
        assert store.get_run(second)["value_set_id"] == store.get_run(first)["value_set_id"]
        logs = [r["message"] for r in store.get_logs(second)]
        assert any("Stage 1 (train): 0 of 12 prompts to sample" in m for m in logs), logs  # nothing sampled again
        counts = [v["num_correct"] for (split, _), v in truth_first.items() if split == "train"]
        assert 0 in counts and any(0 < k < N for k in counts), counts  # a prompt to drop and a partly solved one
        truth_second = check_run(store, services, second, 0.1, True, monkeypatch)
        # The reference samples are stored once (one row per prompt), shared by both runs.
        with store._read() as s:
            assert s.connection().exec_driver_sql("SELECT count(*) FROM prompt_values").scalar() == 12 + 4
        # The first run's pages are unchanged by the second.
        assert check_run(store, services, first, 0.5, False, monkeypatch) == truth_first
        check_status(client, first, truth_first)
        check_status(client, second, truth_second)
        check_rows(store, first, truth_first)
        check_rows(store, second, truth_second)
        # The Compare page names the settings the two runs' V* differ by.
        diff = compare.config_diff([store.get_run(first), store.get_run(second)])
        assert {"config.beta1", "config.filter_all_incorrect"} <= set(diff["setting"])
    finally:
        if store is not None:
            store.close()
        stop_app(proc)
