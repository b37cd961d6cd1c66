"""Runs of several processes (`num_processes`) on this CPU: gloo processes under `accelerate launch`, started by the
scheduler (`app.runtime.scheduler`) and run by the worker (`app.runtime.worker`) as the dashboard runs them.

A 2-process run with 2 prompts per process and step is the 1-process run with 4 (the same global batch): the same
V* table (every prompt's rewards and completions), the same loss at every step within 1e-5 (only the order of float
sums differs), every stage-1 row and every step's samples of both processes stored, by the main process. A Stop
reaches both processes at the same step: the run ends "stopped" with one checkpoint, every process exits, and a
resume with 2 processes continues it to the same losses. A killed process (a rank, or the launcher) fails the run
as a dead worker does, and takes the others with it.

Real worker processes, a real SQLite file per scenario, a tiny model taught half of the prompts (so rewards, V*,
advantages and gradients are not all zero).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import pytest

from a2po.checkpoints import checkpoint_complete
from app.access import allowlist
from app.access.policy import Policy
from app.runtime.devices import Devices
from app.runtime.processes import is_worker_of, launched_processes, pid_alive
from app.runtime.scheduler import Scheduler
from app.web import forms
from storage import Store
from tests import helpers
from tests.runtime.test_durability import finished_run, make_manager, record, wait_status
from tests.web.test_app_api import free_port, start_app, stop_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
wait_for = functools.partial(helpers.wait_for, poll=0.05)
NUM_PROMPTS, EVAL_SIZE, MAX_STEPS, GLOBAL_BATCH = 16, 4, 10, 4  # steps to spare after the stop, for the kills


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny model that answers every other prompt of the run (it is sampled at temperature 1: mostly right)."""
    from a2po.data import arithmetic_dataset
    from a2po.testing import make_tiny_model, teach_answers

    model, tokenizer = make_tiny_model()
    total = NUM_PROMPTS + EVAL_SIZE
    rows = arithmetic_dataset(total, operations="+", difficulty=1, seed=0).select(range(0, total, 2))
    teach_answers(model, tokenizer, rows["prompt"], rows["ground_truth"], steps=150)
    path = tmp_path_factory.mktemp("taught-tiny-multiprocess")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def raw_spec(model: str, name: str, processes: int = 1) -> dict:
    """16 prompts in stage-1 batches of 4, MAX_STEPS steps of GLOBAL_BATCH prompts, 4 held-out prompts."""
    config = {"num_value_samples": 4, "max_completion_length": 6, "max_steps": MAX_STEPS,
              "per_device_train_batch_size": GLOBAL_BATCH // processes, "value_batch_size": 4, "use_cpu": True,
              "logging_steps": 1, "gradient_checkpointing": False, "seed": 0, "save_steps": 100,
              "learning_rate": 5e-3, "beta2": 0.1, "filter_all_incorrect": False}
    return {"name": name, "action": "train", "model": model, "num_processes": processes,
            "dataset": {"source": "arithmetic", "num_prompts": NUM_PROMPTS, "difficulty": 1, "operations": "+",
                        "seed": 0, "eval_size": EVAL_SIZE},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": config}


def studio_spec(model: str, name: str, processes: int = 1) -> dict:
    """The spec as the dashboard stores it (every form setting explicit), so the API's runs compare with these."""
    result = allowlist.check_spec(raw_spec(model, name, processes), Policy(Path(model).parent, model_roots=(model,)))
    assert result.ok, result.errors
    return result.spec


def assert_same_run(two: dict, one: dict) -> None:
    assert one["values"] and two["values"] == one["values"]  # every prompt's V*, rewards and completions
    assert len(one["values"]) == NUM_PROMPTS + EVAL_SIZE
    assert any(v[0] > 0 for v in one["values"].values()) and any(v[0] == 0 for v in one["values"].values())
    assert two["steps"] == one["steps"] == MAX_STEPS and two["loss_rows"] == MAX_STEPS
    assert sorted(two["losses"]) == list(range(1, MAX_STEPS + 1))
    assert max(abs(two["losses"][s] - one["losses"][s]) for s in one["losses"]) <= 1e-5, (two["losses"],
                                                                                          one["losses"])
    assert len(set(one["losses"].values())) > 1  # the losses move: the comparison compares something
    # Both processes' samples of every step, stored once each by the main process.
    assert two["samples"] == one["samples"]
    assert all(n == GLOBAL_BATCH for (split, _), n in one["samples"].items() if split == "train")
    assert two["eval"] == one["eval"]


def values_stored_once(store: Store, run_id: int) -> None:
    rows = store.get_values(store.get_run(run_id)["value_set_id"], split=None)
    keys = [(r["split"], r["prompt_id"]) for r in rows]
    assert len(keys) == len(set(keys)) == NUM_PROMPTS + EVAL_SIZE


def processes_gone(pids: list[int], timeout: float = 60.0) -> None:
    wait_for(lambda: not any(map(pid_alive, pids)), timeout, f"processes {pids} to exit")


def rank_of(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return int(env[b"RANK"])


def steps_done(store: Store, run_id: int) -> int:
    return len(store.get_metrics(run_id, names=["loss"]))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dir) -> dict:
    """The 1-process run: 4 prompts per step."""
    store, run = finished_run(tmp_path_factory.mktemp("one-process"), studio_spec(model_dir, "one"), timeout=180)
    values_stored_once(store, run["id"])
    return record(store, run["id"])


def test_stop_reaches_every_process_and_resume_and_crashes_work_as_for_one(tmp_path, model_dir, reference):
    # From the 3rd step on, each step takes a second more: the stop, sent after step 2, lands well before the run's
    # last step however busy the machine (a tiny step is faster than a stop's way to the processes under load).
    store, manager = make_manager(tmp_path / "data", faults="train_step@3+=delay")
    manager.worker_env["A2PO_FAULT_DELAY"] = "1"
    run_id = manager.submit(studio_spec(model_dir, "two", processes=2))
    manager.start()
    try:
        # The run's pid is the launcher's: the process the scheduler started, an `app.runtime.worker` of this run.
        wait_for(lambda: steps_done(store, run_id) >= 2, 180, "two training steps")
        run = store.get_run(run_id)
        launcher, ranks = run["pid"], launched_processes(run["pid"])
        assert launcher == manager.backend.launchers["worker"].procs[run_id].pid and is_worker_of(launcher, run_id)
        assert sorted(map(rank_of, ranks)) == [0, 1] and all(os.getpgid(r) == r for r in ranks)

        # Stop: both processes stop after the same step and write its checkpoint; the run ends "stopped".
        assert manager.stop(run_id)
        run = wait_status(store, run_id, ("stopped", "failed", "finished"), timeout=120)
        assert run["status"] == "stopped", run["error"]
        processes_gone([launcher, *ranks])
        stopped_at = steps_done(store, run_id)
        assert stopped_at < MAX_STEPS
        checkpoints = store.list_checkpoints(run_id)
        assert [c["step"] for c in checkpoints] == [stopped_at]  # save_steps 100: only the stop's checkpoint
        folder = Path(checkpoints[0]["path"])
        assert checkpoint_complete(folder) and {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(folder))
        log = (tmp_path / "data" / "logs" / f"run-{run_id}.log").read_text()
        assert "ChildFailedError" not in log  # every process exited cleanly, the launcher too

        # A killed process fails the run like a dead worker, and no process of the run survives it: a rank...
        manager.resume(run_id)
        wait_for(lambda: store.get_run(run_id)["status"] == "running" and steps_done(store, run_id) > stopped_at,
                 180, "a step after the resume")
        launcher = store.get_run(run_id)["pid"]
        ranks = launched_processes(launcher)
        os.kill(next(r for r in ranks if rank_of(r) == 1), signal.SIGKILL)
        run = wait_status(store, run_id, ("failed", "finished", "stopped"), timeout=120)
        # Process 0 records it: its next collective with the dead process failed (or the launcher, seeing one
        # process die, ended the others: then the scheduler does).
        assert run["status"] == "failed" and ("One of the run's 2 processes" in run["error"] or "Worker exited"
                                              in run["error"]), run["error"]
        processes_gone([launcher, *ranks])

        # ... or the launcher (its processes die with it).
        manager.resume(run_id)
        wait_for(lambda: store.get_run(run_id)["status"] == "running" and steps_done(store, run_id) > stopped_at,
                 180, "a step after the resume")
        launcher = store.get_run(run_id)["pid"]
        ranks = launched_processes(launcher)
        os.kill(launcher, signal.SIGKILL)
        # Its processes are ended with it (their process group); on a loaded machine that takes seconds.
        processes_gone([launcher, *ranks], timeout=30)
        run = wait_status(store, run_id, ("failed", "finished", "stopped"), timeout=60)
        assert run["status"] == "failed" and "code -9" in run["error"], run["error"]

        # The last resume continues from the stop's checkpoint with 2 processes, to the 1-process run's end.
        manager.resume(run_id)
        run = wait_status(store, run_id, ("finished", "failed"), timeout=180)
        assert run["status"] == "finished", run["error"]
    finally:
        manager.close()
    logs = [r["message"] for r in store.get_logs(run_id)]
    # Each resume from a complete checkpoint, the first from the stop's (a killed process may take its last second
    # of log lines with it, and a slow kill may come after a later checkpoint).
    resumed_from = [m.rsplit(" ", 1)[-1] for m in logs if "resuming stage 2 from" in m]
    assert resumed_from and resumed_from[0] == f"{folder}.", logs
    values_stored_once(store, run_id)
    assert_same_run(record(store, run_id), reference)


def test_a_two_process_run_launched_through_the_api_matches_the_one_process_run(tmp_path, model_dir, reference):
    from gradio_client import Client

    data_dir = tmp_path / "studio"
    app = start_app(data_dir, free_port(), "--model-root", model_dir)
    try:
        client = Client(f"http://127.0.0.1:{app.args[app.args.index('--port') + 1]}/", verbose=False)
        launched = client.predict(spec=raw_spec(model_dir, "api-two", processes=2), api_name="/launch")
        run_id = launched["run_id"]
        assert "--num_processes 2" in launched["command"]
        status = helpers.wait_for(lambda: (s := client.predict(run_id=run_id, api_name="/status"))["status"]
                                  in ("finished", "failed") and s, 240, "the run to end")
        assert status["status"] == "finished", status["error"]
        assert status["spec"]["num_processes"] == 2
    finally:
        stop_app(app)
    store = Store(data_dir / "studio.db")
    run = store.get_run(run_id)
    assert run["num_processes"] == 2
    # The launcher exits once every rank has left its process group, shortly after the run's end is written.
    helpers.wait_for(lambda: not pid_alive(run["pid"]), 60, "the launcher to exit")
    values_stored_once(store, run_id)
    assert_same_run(record(store, run_id), reference)


# ------------------------------------------------------------------------------------ without starting processes

def test_processes_are_bounded_by_the_machine(tmp_path):
    cpu = Devices(cpu_processes=2)
    assert cpu.check(1) is None and cpu.check(2) is None
    assert "no GPU" in cpu.check(3) and "at most 2" in cpu.check(3)
    assert "FSDP" in cpu.check(2, fsdp=True)
    assert cpu.allocate(2, set()) == ["cpu"] and cpu.allocate(2, {"cpu"}) is None  # a run takes the machine
    gpus = Devices(("0", "1"))
    assert gpus.check(2, fsdp=True) is None and "2 GPU(s)" in gpus.check(3)

    store, manager = make_manager(tmp_path / "data", devices=cpu)
    with pytest.raises(ValueError, match="no GPU"):
        manager.submit({**raw_spec("m", "x"), "num_processes": 3})
    one = manager.worker_command(7, {"num_processes": 1})
    assert one[1:3] == ["-m", "app.runtime.worker"]
    assert one[-4:] == ["--run-id", "7", "--data-dir", str(manager.data_dir)]
    two = manager.worker_command(7, {"num_processes": 2})
    assert two[:3] == [sys.executable, "-m", "accelerate.commands.launch"] and "--multi_gpu" in two
    assert two[two.index("--num_processes") + 1] == "2" and two[two.index("--module") + 1] == "app.runtime.worker"
    assert "--use_fsdp" not in manager.worker_command(7, {"num_processes": 2, "fsdp": "FULL_SHARD"})  # no GPU
    fsdp = Scheduler(store, tmp_path / "data", devices=gpus).worker_command(7, {"num_processes": 2,
                                                                                  "fsdp": "FULL_SHARD"})
    assert "--multi_gpu" not in fsdp and fsdp[fsdp.index("--fsdp_sharding_strategy") + 1] == "FULL_SHARD"


def test_the_spec_names_its_processes():
    from a2po.runspec import RunSpec

    policy = Policy(Path("/tmp"))
    spec = {"model": "SmolLM2-135M-Instruct", "num_processes": 2}
    assert allowlist.check_spec(spec, policy).spec["num_processes"] == 2
    assert allowlist.check_spec({"model": "SmolLM2-135M-Instruct"}, policy).spec["num_processes"] == 1
    # Specs stored before the rename still load, in the library and through the allow-list.
    assert RunSpec.from_dict({"num_devices": 3}).num_processes == 3
    assert allowlist.check_spec({**spec, "num_devices": 3}, policy).spec["num_processes"] == 2
    assert allowlist.check_spec({"num_devices": 3}, policy).spec["num_processes"] == 3
    errors = allowlist.check_spec({**spec, "num_processes": 0, "fsdp": "EVERYTHING"}, policy).errors
    assert "num_processes must be a whole number >= 1" in errors["num_processes"] and "FULL_SHARD" in errors["fsdp"]
    assert "set num_processes >= 2" in allowlist.check_spec({"fsdp": "FULL_SHARD"}, policy).errors["fsdp"]
    assert "at most 64 per run" in allowlist.check_spec({"num_devices": 100}, policy).errors["num_processes"]
    assert forms.spec_to_form({"num_processes": 2})["num_processes"] == 2
    assert forms.form_to_spec({**forms.default_form(), "num_processes": 2})["num_processes"] == 2
    run = RunSpec.from_dict({"num_processes": 2, "fsdp": "SHARD_GRAD_OP"})
    assert "--num_processes 2" in run.command()


def test_the_cli_runs_itself_again_under_accelerate():
    from a2po.cli import launch_command, parse, spec_from_args
    from a2po.runspec import RunSpec

    argv = RunSpec.from_dict({"name": "x", "model": "m", "num_processes": 2}).to_cli_args()
    command, script, _, fields = parse(argv)
    assert script.num_processes == 2 and spec_from_args(command, script, fields).num_processes == 2
    launch = launch_command(2, argv)
    assert launch[:3] == [sys.executable, "-m", "accelerate.commands.launch"] and "--multi_gpu" in launch
    assert launch[launch.index("--module") + 1:] == ["a2po", *argv]  # the same command, in every process
