"""Chunked runs (`app.runtime.chunks`): a run executed as short chunks, each in a freshly forked process that restores
it from disk, ends as the same run executed by one worker process; a chunk killed mid-way loses nothing committed;
ZeroGPU mode (`app.runtime.zerogpu`) wraps exactly the chunk function and drives it from the Run page.

Real forked processes, real SQLite files, the tiny random-init model; a fake `spaces` package
(`tests/fake_spaces`) stands in for ZeroGPU's.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import pytest

from app.runtime import chunks, journal
from app.runtime.chunks import is_chunk_of, run_chunk
from storage import lifecycle
from tests import helpers
from tests.runtime.test_durability import make_manager, record, wait_status
from tests.web.test_app_api import free_port, start_app, stop_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
wait_for = functools.partial(helpers.wait_for, poll=0.1)
FAKE_SPACES = Path(__file__).resolve().parents[1] / "fake_spaces"
MAX_STEPS = 6


def chunk_spec(model: str, name: str = "chunks", runner: str = "chunked", **config) -> dict:
    """12 prompts in 3 stage-1 batches, 4 held out; 6 steps of 4 prompts with a checkpoint every 2. A large beta2
    and learning rate, and a hot sampling temperature, make the losses move (with `taught_model`)."""
    settings = {"num_value_samples": 2, "max_completion_length": 6, "max_steps": MAX_STEPS,
                "per_device_train_batch_size": 4, "value_batch_size": 4, "per_device_eval_batch_size": 4,
                "use_cpu": True, "logging_steps": 1, "gradient_checkpointing": False, "seed": 0, "save_steps": 2,
                "learning_rate": 3e-3, "beta2": 0.5, "temperature": 2.0, "filter_all_incorrect": False, **config}
    return {"name": name, "action": "train", "model": model, "runner": runner,
            "dataset": {"source": "arithmetic", "num_prompts": 12, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 4},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings}


def assert_same(chunked: dict, reference: dict) -> None:
    assert chunked["values"] == reference["values"]  # every prompt's V*, rewards and completions
    assert chunked["steps"] == reference["steps"] == MAX_STEPS and chunked["loss_rows"] == MAX_STEPS
    assert chunked["samples"] == reference["samples"]  # none lost or doubled
    assert any(abs(loss) > 1e-4 for loss in reference["losses"].values())  # losses that say something
    for step, loss in reference["losses"].items():
        assert chunked["losses"][step] == pytest.approx(loss, abs=1e-6), f"step {step}"
    assert chunked["eval"] == reference["eval"]


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory) -> str:
    """The tiny model taught the answers of every other prompt (`a2po.testing.teach_answers`): its samples are
    sometimes right, so V*, the rewards and the losses are not all zero."""
    from a2po.data import arithmetic_dataset
    from a2po.testing import make_tiny_model, teach_answers

    model, tokenizer = make_tiny_model()
    prompts = arithmetic_dataset(16, operations="+", difficulty=1, seed=0).select(range(0, 16, 2))
    teach_answers(model, tokenizer, prompts["prompt"], prompts["ground_truth"], steps=15)  # half learned
    path = tmp_path_factory.mktemp("taught")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, taught_model) -> dict:
    """The same run in one worker process, never interrupted."""
    store, manager = make_manager(tmp_path_factory.mktemp("worker"))
    run_id = manager.submit(chunk_spec(taught_model, "worker", runner="worker"))
    manager.start()
    try:
        run = wait_status(store, run_id, ("finished", "failed"), timeout=180)
        assert run["status"] == "finished", run["error"]
        assert run["chunks_done"] == 0
        return record(store, run_id)
    finally:
        manager.close()


def drive(manager, store, run_id: int, until, change=None, timeout: float = 180.0) -> dict:
    """Scheduler passes by hand until `until(run)`: settle exited chunks, then (between two chunks, when no chunk
    process is left) `change(run)`, then start the next chunk. Returns the run."""
    deadline = time.monotonic() + timeout
    manager.lock.acquire()
    while time.monotonic() < deadline:
        with manager._lock:
            manager._reap()
            manager._supervise()
        run = store.get_run(run_id)
        if until(run):
            return run
        if change is not None and run_id not in manager._started and run["status"] == "queued":
            change(run)
        with manager._lock:
            manager._admit()
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} is {store.get_run(run_id)['status']}; logs: "
                         f"{[r['message'] for r in store.get_logs(run_id)][-12:]}")


def test_forked_chunks_end_like_one_worker_and_a_killed_chunk_loses_nothing(tmp_path, taught_model, reference):
    # Budget ~0: every chunk does one stage-1 batch or one training step, in a freshly forked process.
    store, manager = make_manager(tmp_path / "data", chunk_seconds=0.01)
    run_id = manager.submit(chunk_spec(taught_model))
    phase = {"killed": False, "armed": False}

    def change(run):
        checkpoint = store.latest_checkpoint(run_id)
        if not phase["armed"] and checkpoint and checkpoint["step"] == 3:
            # One long chunk, killed inside its 2nd step: it trains step 4, writes checkpoint-4, dies in step 5.
            phase["armed"] = True
            manager.backend.launchers["chunked"].budget = 120.0
            manager.worker_env = dict(os.environ, A2PO_FAULTS="train_step@2=kill")
        elif phase["armed"] and not phase["killed"] and run["auto_resumes"] == 1:
            phase["killed"] = True
            manager.backend.launchers["chunked"].budget = 0.01
            manager.worker_env = dict(os.environ, A2PO_FAULTS="")

    try:
        run = drive(manager, store, run_id, lambda r: r["status"] in ("finished", "failed"), change)
        assert run["status"] == "finished", run["error"]
        assert phase["killed"]
        logs = [r["message"] for r in store.get_logs(run_id)]
        died = [m for m in logs if m.startswith("Its chunk process exited with code -9")]
        assert len(died) == 1, logs
        # What the killed chunk committed stayed: the next chunk resumed from its checkpoint-4.
        after = logs[logs.index(died[0]):]
        assert any(m.endswith("resuming stage 2 from " + str(Path(run["output_dir"]) / "checkpoint-4") + ".")
                   for m in after), after
        # Stage 1 went batch by batch, one per chunk: 12 train prompts in 3 chunks, then the 4 held out.
        assert [m for m in logs if m.startswith("Stage 1 (train):")][:4] == [
            f"Stage 1 (train): {12 - 4 * i} of 12 prompts to sample ({4 * i} already have V*)." for i in range(4)]
        assert run["chunks_done"] >= 4 + MAX_STEPS and run["chunk_seconds"] > 0 and run["auto_resumes"] == 0
        assert_same(record(store, run_id), reference)
    finally:
        manager.close()


def test_a_chunk_that_meets_a_full_disk_leaves_the_run_to_its_next_chunk(tmp_path, taught_model, reference):
    """A chunk whose checkpoint-4 meets a full disk (its weights written, then ENOSPC): the run is not failed; its
    next chunk goes on from checkpoint-2, the torn folder removed, to the same result as one worker."""
    store, manager = make_manager(tmp_path / "data", "checkpoint@2=disk_full", chunk_seconds=120.0)
    run_id = manager.submit(chunk_spec(taught_model, "disk-full"))
    phase = {"met": False}

    def change(run):
        if not phase["met"] and run["auto_resumes"] == 1:  # the disk has room again for the next chunk
            phase["met"] = True
            manager.worker_env = dict(os.environ, A2PO_FAULTS="")

    try:
        run = drive(manager, store, run_id, lambda r: r["status"] in ("finished", "failed"), change)
        assert run["status"] == "finished", run["error"]
        assert phase["met"]
        logs = [r["message"] for r in store.get_logs(run_id)]
        met = [m for m in logs if m.startswith("Its chunk process met a full disk (OSError: [Errno 28] No space left "
                                               "on device")]
        assert len(met) == 1 and "the next chunk continues from the last checkpoint" in met[0], logs
        after, output = logs[logs.index(met[0]):], Path(run["output_dir"])
        assert any(m.endswith("resuming stage 2 from " + str(output / "checkpoint-2") + ".") for m in after), after
        assert any(m.endswith("removing incomplete checkpoint " + str(output / "checkpoint-4") + ".")
                   for m in after), after
        assert_same(record(store, run_id), reference)
    finally:
        manager.close()


def test_run_chunk_is_a_plain_function_and_only_the_parent_claims(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    store, manager = make_manager(data)
    # Without an input written by its parent, a chunk does nothing (and never looks for the database).
    result = run_chunk(data, 999, 1.0)
    assert result == {"run_id": 999, "outcome": "not-started", "seconds": 0.0}
    assert json.loads(json.dumps(result)) == result  # plain data
    chunked = manager.submit(chunk_spec(tiny_model_dir))
    store.apply(chunked, lifecycle.CLAIM, pid=os.getpid())  # running elsewhere: no second claim
    assert chunks.claim(store, data, store.get_run(chunked), pid=os.getpid()) is None
    assert not journal.input_path(data, chunked).exists()
    assert not is_chunk_of(os.getpid(), chunked)  # no thread of this process runs a chunk of it


def test_equal_time_on_chunks_ends_at_the_budget_and_runs_every_evaluation_left_for_the_next_chunk(
        tmp_path, tiny_model_dir):
    # Chunks of ~0 s: each does one stage-1 batch, or the evaluation the chunk before left and one step, so every
    # evaluation the time grid asks for is left for the next chunk, and the budget runs out in a chunk's last step.
    budget = 1.0
    spec = chunk_spec(tiny_model_dir, "equal-time", max_steps=-1, num_train_epochs=20.0, save_steps=1000,
                      max_train_seconds=budget, eval_every_seconds=budget / 3)
    store, manager = make_manager(tmp_path / "data", chunk_seconds=0.01)
    run_id = manager.submit(spec)
    try:
        run = drive(manager, store, run_id, lambda r: r["status"] in ("finished", "failed"), timeout=900)
    finally:
        manager.close()
    assert run["status"] == "finished", run["error"]
    logs = [line["message"] for line in store.get_logs(run_id, limit=None)]
    stage1 = store.latest_metrics(run_id)["values/train/runtime"]["value"]
    clocks = {m["step"]: stage1 + m["value"] for m in store.get_metrics(run_id, names=["train_seconds"])}
    steps = sorted(s for s in clocks if s > 0)
    assert steps and steps == list(range(1, steps[-1] + 1)) and steps[-1] < 60  # 20 epochs of 3 steps: never reached
    # The run's clock, carried by its checkpoints from chunk to chunk, ended it at the first step past the budget.
    assert clocks[steps[-1]] >= budget - 1e-3, (clocks, logs[-20:])
    assert all(clocks[step] < budget + 1e-3 for step in steps[:-1]), (clocks, logs[-20:])
    evaluated = {e["step"] for e in store.get_evaluations(run_id)}
    left = {int(m.group(1)) for line in logs if (m := re.search(r"The evaluation of step (\d+) is left", line))}
    assert left - {steps[-1]}, f"no time-grid evaluation was left for a next chunk: {logs[-20:]}"
    assert left <= evaluated and {0, steps[-1]} <= evaluated, (left, evaluated)
    # Every step whose clock passed a multiple of eval_every_seconds was evaluated (steps within rounding of one
    # are left out: the logged clock is rounded).
    every, before, crossed = budget / 3, stage1, set()
    for step in steps:
        near = abs(clocks[step] / every - round(clocks[step] / every)) * every < 1e-3
        if math.floor(clocks[step] / every) > math.floor(before / every) and not near:
            crossed.add(step)
        before = clocks[step]
    assert crossed and crossed <= evaluated, (crossed, evaluated)


def test_fake_spaces_wraps_exactly_the_chunk_function(monkeypatch, tmp_path, tiny_model_dir):
    import importlib
    import types

    wrapped: list[tuple] = []
    fake = types.ModuleType("spaces")

    def GPU(task=None, *, duration=None, size=None):  # noqa: N802
        def wrap(function):
            wrapped.append((function, duration))
            return function
        return wrap(task) if callable(task) else wrap

    fake.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.delitem(sys.modules, "app.runtime.zerogpu", raising=False)
    zerogpu = importlib.import_module("app.runtime.zerogpu")  # wrapping happens at import
    try:
        assert [w[0] for w in wrapped] == [zerogpu.chunk_on_gpu]
        duration = wrapped[0][1]
        assert callable(duration)
        assert duration("dir", 1, 40.0) == 60 and duration("dir", 1, 100.0) == 120  # budget + margin
        assert duration("dir", 1, 0.5, False) == 21

        # The Run page's driver in ZeroGPU mode: chunk after chunk in this process (as a ZeroGPU worker process
        # that serves call after call), until the run ends.
        store, manager = make_manager(tmp_path / "data", zerogpu=True, chunk_seconds=0.01)
        run_id = manager.submit(chunk_spec(tiny_model_dir, max_steps=2, save_steps=0))
        assert store.get_run(run_id)["config"]["runner"] == "chunked"  # every run is chunked there
        manager.lock.acquire()
        assert manager.tick() == []  # the scheduler starts no chunk there
        from app.access.gate import Services

        calls = []

        def on_gpu(*args):
            calls.append(args)
            return zerogpu.gpu_chunk(*args)

        driver = zerogpu.ChunkDriver(Services(store=store, scheduler=manager, data_dir=tmp_path / "data"))
        # While the scheduler holds its queue (the studio's `Policy.disk_problem`), the page starts no chunk either.
        full = "Only 0.42 GB of disk is free under /data: free some before launching a run."
        manager.hold_queue = lambda: full
        held = driver.drive(run_id, function=on_gpu)
        assert calls == [] and held["status"] == "queued" and held["held"] == full
        from app.web.pages.chunks import render

        assert "waiting: Only 0.42 GB of disk is free" in render(held)
        manager.hold_queue = None
        info = None
        for _ in range(20):
            info = driver.drive(run_id, function=on_gpu)
            if info["status"] not in ("queued", "paused"):
                break
        assert info["status"] == "finished", store.get_run(run_id)["error"]
        assert info["chunks_done"] == len(calls) >= 4 and info["step"] == 2
        assert all(a[1:3] == (run_id, 0.01) for a in calls)
        assert driver.drive(run_id, function=on_gpu)["chunks_done"] == len(calls)  # nothing left to drive
        # Only its launcher's page drives a run (their quota pays).
        store.update_run(run_id, owner="hf:alice")
        assert not driver.may_drive(store.get_run(run_id), None)
        manager.close()
    finally:
        monkeypatch.delitem(sys.modules, "spaces")
        importlib.reload(zerogpu)


def test_real_spaces_outside_zerogpu_changes_nothing(monkeypatch):
    import importlib

    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    import spaces

    assert not hasattr(spaces, "FAKE")  # the package from PyPI
    monkeypatch.delitem(sys.modules, "app.runtime.zerogpu", raising=False)  # imported afresh, with the real package
    zerogpu = importlib.import_module("app.runtime.zerogpu")
    assert not zerogpu.enabled()
    assert zerogpu.gpu_chunk is zerogpu.chunk_on_gpu  # spaces.GPU returned it unchanged
    assert zerogpu.wrap(spaces) is zerogpu.chunk_on_gpu
    assert zerogpu.enabled({"SPACES_ZERO_GPU": "true"})


def test_a_chunked_run_through_the_api(tmp_path, tiny_model_dir, monkeypatch):
    from gradio_client import Client

    # Two OpenMP threads: had the app's own process run a torch operation before forking a chunk, the chunk would
    # hang in its first parallel one (GNU libgomp after fork).
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    proc = start_app(tmp_path / "studio", free_port(), "--model-root", tiny_model_dir, "--chunk-seconds", "0.5")
    try:
        client = Client(f"http://127.0.0.1:{proc.args[proc.args.index('--port') + 1]}/", verbose=False)
        spec = chunk_spec(tiny_model_dir, "api", max_steps=2, save_steps=0)
        run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
        status = wait_for(lambda: (s := client.predict(run_id=run_id, api_name="/status"))["status"] in (
            "finished", "failed") and s, 150, "the chunked run to end")
        assert status["status"] == "finished", status["error"]
        assert status["spec"]["runner"] == "chunked" and status["chunks_done"] >= 2
    finally:
        stop_app(proc)


def test_zerogpu_run_page_drives_chunks_pauses_when_closed_and_resumes(tmp_path, tiny_model_dir):
    import playwright.sync_api as playwright
    from gradio_client import Client

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    calls = tmp_path / "gpu-calls.jsonl"
    env = {"SPACES_ZERO_GPU": "true", "FAKE_SPACES_LOG": str(calls),
           "PYTHONPATH": os.pathsep.join([str(FAKE_SPACES), os.environ.get("PYTHONPATH", "")])}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        port = free_port()
        proc = start_app(tmp_path / "studio", port, "--model-root", tiny_model_dir, "--chunk-seconds", "0.01",
                         "--pause-after", "4")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    url = f"http://127.0.0.1:{port}/"
    try:
        wraps = [json.loads(line) for line in calls.read_text().splitlines()]
        assert [w["name"] for w in wraps if w["event"] == "wrap"] == ["app.runtime.zerogpu.chunk_on_gpu"]
        client = Client(url, verbose=False)
        spec = chunk_spec(tiny_model_dir, "zerogpu", runner="worker", max_steps=200, save_steps=0)
        run_id = client.predict(spec=spec, api_name="/launch")["run_id"]

        def status():
            return client.predict(run_id=run_id, api_name="/status")

        assert status()["spec"]["runner"] == "chunked" and status()["chunks_done"] == 0
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.set_default_timeout(60_000)

            def open_run(expect_status: str | None = None):
                """A fresh page; the Runs table (showing `expect_status`), a click on the run opens its page."""
                page.goto(url, wait_until="load")
                page.wait_for_selector("#main-tabs")
                page.get_by_role("tab", name="Runs", exact=True).first.click()
                table = page.locator("#runs-table")
                if expect_status:
                    playwright.expect(table.get_by_text(expect_status, exact=True).filter(visible=True).first
                                      ).to_be_visible()
                table.get_by_text("zerogpu", exact=True).filter(visible=True).first.click()
                # A loaded machine answers the click's event late: wait on the header, not a fixed 5 s.
                playwright.expect(page.locator("#run-header")).to_contain_text("zerogpu", timeout=60_000)

            def chunks_shown() -> int:
                info = page.locator("#chunk-info")
                return int(info.get_attribute("data-chunks")) if info.count() else -1

            open_run()
            # The page runs chunks while it is open: the count grows on the page.
            wait_for(lambda: chunks_shown() >= 2, 90, "two chunks driven by the page")
            page.close()
            # Closed: no page drives it, it pauses (and stays paused).
            wait_for(lambda: status()["status"] == "paused", 60, "the run to pause")
            paused = status()["chunks_done"]
            time.sleep(1)
            assert status()["status"] == "paused" and status()["chunks_done"] == paused
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.set_default_timeout(60_000)
            open_run("paused")  # reopened: it goes on
            wait_for(lambda: chunks_shown() > paused, 90, "a chunk after reopening")
            assert status()["status"] in ("queued", "running")
            browser.close()
        lines = [json.loads(line) for line in calls.read_text().splitlines()]
        gpu_calls = [c for c in lines if c["event"] == "call"]
        assert gpu_calls and all(c["name"] == "chunk_on_gpu" and c["duration"] == 21 for c in gpu_calls)
    finally:
        stop_app(proc)
