"""The worker, the recorder and the scheduler, end to end: real worker processes, a real SQLite file, and a
tiny random-init model (`tiny_model_dir` in conftest). Every run samples 8-16 arithmetic prompts a few times."""

from __future__ import annotations

import functools
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from app.runtime.data_folder import DataFolder
from app.runtime.scheduler import Scheduler
from storage import Store
from tests import helpers

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# Stop requests must land while a stage is still running: poll often.
wait_for = functools.partial(helpers.wait_for, poll=0.1)


def make_spec(model: str, name: str, *, num_prompts: int = 8, eval_size: int = 4, **config) -> dict:
    settings = {"num_value_samples": 2, "max_completion_length": 8, "max_steps": 2, "per_device_train_batch_size": 4,
                "per_device_eval_batch_size": 4, "use_cpu": True, "report_to": "none", "save_strategy": "no",
                "logging_steps": 1, "gradient_checkpointing": False, "seed": 0,
                # A random-init model solves nothing: keep every prompt instead of filtering them all out.
                "filter_all_incorrect": False, **config}
    return {"name": name, "action": "train", "model": model,
            "dataset": {"source": "arithmetic", "num_prompts": num_prompts, "difficulty": 1, "operations": "+",
                        "seed": 0, "eval_size": eval_size},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings, "peft": None}


def wait_status(store: Store, run_id: int, statuses: tuple[str, ...], timeout: float = 90.0) -> dict:
    return helpers.wait_status(store, run_id, statuses, timeout, poll=0.1)


@pytest.fixture
def env(tmp_path):
    store = Store(tmp_path / "studio.db")
    manager = Scheduler(store, tmp_path / "data", poll_interval=0.2)
    yield store, manager
    manager.close()
    for run_id in manager.active_run_ids():  # never leave a worker behind a failed test
        manager.delete(run_id)


def test_train_end_to_end_and_value_set_reuse(env, tiny_model_dir):
    store, manager = env
    first = manager.submit(make_spec(tiny_model_dir, "first"))
    # Same model, data, rewards and sampling settings: same V* set, although training settings differ.
    second = manager.submit(make_spec(tiny_model_dir, "second", beta2=0.01, max_steps=1))
    assert store.get_run(first)["status"] == "queued"
    manager.start()

    run = wait_status(store, first, ("finished", "failed"))
    assert run["status"] == "finished", run["error"]
    assert run["progress"] == 1.0 and run["best_eval_accuracy"] is not None
    value_set = store.get_value_set(run["value_set_id"])
    assert value_set["complete"] and {"train", "eval"} <= set(value_set["summary"])
    assert store.count_values(value_set["id"], "train") == 8 and store.count_values(value_set["id"], "eval") == 4
    assert all(len(v["completions"]) == 2 and v["v_star"] is not None for v in store.get_values(value_set["id"]))
    names = store.metric_names(first)
    assert {"loss", "reward", "v_star", "advantage", "eval_accuracy"} <= set(names)
    assert any(n.startswith("values/train/") for n in names)
    assert sorted({m["step"] for m in store.get_metrics(first, names=["loss"])}) == [1, 2]
    samples = store.get_samples(first, limit=None)
    assert Counter((s["split"], s["step"]) for s in samples) == {("eval", 0): 4, ("train", 1): 4, ("train", 2): 4,
                                                                  ("eval", 2): 4}
    # Held-out accuracy before training (step 0) and after.
    assert [e["step"] for e in store.get_evaluations(first)] == [0, 2]
    assert [m["step"] for m in store.get_metrics(first, names=["eval_accuracy"])] == [0, 2]
    assert (Path(run["output_dir"]) / "model.safetensors").is_file()

    run2 = wait_status(store, second, ("finished", "failed"))
    assert run2["status"] == "finished", run2["error"]
    assert run2["started_at"] >= run["finished_at"]  # one job at a time, in queue order
    assert run2["value_set_id"] == run["value_set_id"] and len(store.list_value_sets()) == 1
    assert store.count_values(value_set["id"], None) == 12  # nothing sampled twice
    logs = [r["message"] for r in store.get_logs(second)]
    assert any("Stage 1 (train): 0 of 8 prompts to sample" in m for m in logs), logs
    assert any("Stage 1 (eval): 0 of 4 prompts to sample" in m for m in logs), logs


def test_stop_and_resume_lose_and_duplicate_nothing(env, tiny_model_dir):
    store, manager = env
    max_steps = 8
    # One prompt per stage-1 batch and 32-token completions: stage 1 lasts long enough (~1 s) to be stopped in.
    spec = make_spec(tiny_model_dir, "stop-resume", num_prompts=16, eval_size=0, value_batch_size=1,
                     max_completion_length=32, max_steps=max_steps)
    run_id = manager.submit(spec)
    manager.start()

    # 1. Stop during stage 1: the values sampled so far stay, the rest is sampled after resuming.
    wait_for(lambda: (r := store.get_run(run_id))["value_set_id"] and store.count_values(r["value_set_id"]) > 0,
             what="the first stage-1 batch")
    assert manager.stop(run_id)
    run = wait_status(store, run_id, ("stopped", "failed", "finished"))
    assert run["status"] == "stopped", run["error"]
    value_set_id = run["value_set_id"]
    sampled_before = {row["prompt_id"] for row in store.get_values(value_set_id, "train")}
    assert 0 < len(sampled_before) < 16
    assert not store.get_value_set(value_set_id)["complete"]

    # 2. Resume, then stop during stage 2: a checkpoint is written and recorded.
    manager.resume(run_id)
    wait_for(lambda: store.get_metrics(run_id, names=["loss"]), what="a first stage-2 step")
    assert manager.stop(run_id)
    run = wait_status(store, run_id, ("stopped", "failed", "finished"))
    assert run["status"] == "stopped", run["error"]
    checkpoint = store.latest_checkpoint(run_id)
    assert checkpoint and Path(checkpoint["path"]).is_dir() and 1 <= checkpoint["step"] < max_steps
    assert store.count_values(value_set_id, "train") == 16 and sampled_before <= {
        row["prompt_id"] for row in store.get_values(value_set_id, "train")}
    logs = [r["message"] for r in store.get_logs(run_id)]
    assert any(f"{16 - len(sampled_before)} of 16 prompts to sample" in m for m in logs), logs
    # Where it trains, said in the run's log (issue 46).
    assert any(m.startswith("Training on cpu; weights float32; compute") for m in logs), logs

    # 3. Resume again: stage 2 continues from the checkpoint and finishes.
    manager.resume(run_id)
    run = wait_status(store, run_id, ("finished", "failed"), timeout=120)
    assert run["status"] == "finished", run["error"]
    loss_steps = [m["step"] for m in store.get_metrics(run_id, names=["loss"])]
    assert sorted(loss_steps) == list(range(1, max_steps + 1))  # every step once: none lost, none doubled
    samples = store.get_samples(run_id, limit=None)
    assert Counter(s["step"] for s in samples) == {step: 4 for step in range(1, max_steps + 1)}
    assert store.count_values(value_set_id, "train") == 16 and store.get_value_set(value_set_id)["complete"]
    assert any("resuming stage 2 from" in r["message"] for r in store.get_logs(run_id))


def test_app_restart_adopts_a_live_worker_and_fails_one_that_dies(env, tiny_model_dir, tmp_path):
    store, manager = env
    run_id = manager.submit(make_spec(tiny_model_dir, "doomed", max_steps=1000, eval_size=0))
    manager.start()
    wait_for(lambda: store.last_ids(run_id)["metrics"], what="the worker to train")
    run = store.get_run(run_id)
    assert run["status"] == "running"
    manager.close()  # like an app that exits (Ctrl-C): the worker keeps running

    # A new app process adopts the live worker instead of failing it, and starts nothing else meanwhile.
    queued = manager.submit(make_spec(tiny_model_dir, "waits"))
    restarted = Scheduler(store, tmp_path / "data", poll_interval=0.2)
    try:
        assert restarted.reconcile(schedule=False) == []
        assert restarted.active_run_ids() == [run_id]
        assert restarted.tick() == [] and store.get_run(queued)["status"] == "queued"

        # A worker that dies while the studio watches fails its run (no automatic resume: it may die again).
        os.kill(run["pid"], signal.SIGKILL)
        wait_for(lambda: not restarted.active_run_ids(), what="the worker to die")
        restarted.tick()
        failed = store.get_run(run_id)
        assert failed["status"] == "failed" and "worker died" in failed["error"].lower()
        assert restarted.stop(queued) and store.get_run(queued)["status"] == "stopped"
    finally:
        restarted.close()

    # Deleting the failed run removes its rows and files.
    output_dir = Path(failed["output_dir"])
    assert output_dir == DataFolder(tmp_path / "data").run_output(run_id).resolve() and output_dir.is_dir()
    assert manager.delete(run_id)
    assert store.get_run(run_id) is None and not output_dir.exists() and store.get_metrics(run_id) == []


def test_queue_actions_without_workers(env, tiny_model_dir):
    store, manager = env
    with pytest.raises(ValueError, match="Invalid run spec"):
        manager.submit({**make_spec(tiny_model_dir, "bad"), "rewards": [{"name": "no-such-reward"}]})
    assert store.list_runs() == []

    run_id = manager.submit(make_spec(tiny_model_dir, "queued"))
    with pytest.raises(ValueError, match="only stopped, interrupted or failed runs can be resumed"):
        manager.resume(run_id)
    assert manager.stop(run_id) and store.get_run(run_id)["status"] == "stopped"
    assert not manager.stop(run_id)
    assert manager.resume(run_id) == run_id and store.get_run(run_id)["status"] == "queued"
    assert manager.delete(run_id) and store.get_run(run_id) is None
    assert not manager.delete(run_id)
    with pytest.raises(ValueError, match="does not exist"):
        manager.resume(run_id)
