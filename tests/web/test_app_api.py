"""The dashboard's named API endpoints, driven with `gradio_client` against a real `python -m app` process.

A real SQLite file in a temporary data folder, real worker processes, and the tiny random-init model.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gradio_client import Client

from tests.helpers import wait_for

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_app(data_dir: Path, port: int, *args: str, cwd: Path = ROOT, env: dict | None = None,
              timeout: float = 120) -> subprocess.Popen:
    """`python -m app` on `port` (with more `args`, started in `cwd`, with `env` added to the environment),
    offline, logging to data_dir/app.log; returns once it answers HTTP (within `timeout` seconds)."""
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", **(env or {}))
    # This tree's packages first (the venv may hold an editable install of another checkout), then the caller's.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "app.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--data-dir", str(data_dir), *args],
                            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"The app exited: {(data_dir / 'app.log').read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                if response.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"The app did not answer within {timeout:.0f} s.")


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tiny_spec(model: str, name: str, **config) -> dict:
    settings = {"num_value_samples": 4, "max_completion_length": 8, "max_steps": 2, "per_device_train_batch_size": 4,
                "use_cpu": True, "logging_steps": 1, "gradient_checkpointing": False,
                "filter_all_incorrect": False, **config}  # a random-init model solves (almost) nothing
    return {"name": name, "action": "train", "model": model,
            "dataset": {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 4},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings}


@pytest.fixture(scope="module")
def client(tmp_path_factory, tiny_model_dir) -> Iterator[Client]:
    data_dir = tmp_path_factory.mktemp("studio")
    port = free_port()
    # Tiny test models live in temporary folders: a model root of this studio.
    proc = start_app(data_dir, port, "--model-root", tiny_model_dir)
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False)
    finally:
        stop_app(proc)


def test_endpoints_are_named(client):
    endpoints = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert {"/launch", "/stop", "/resume", "/delete", "/status", "/list_runs", "/metrics"} <= set(endpoints)


def test_launch_status_list_and_metrics(client, tiny_model_dir):
    launched = client.predict(spec=tiny_spec(tiny_model_dir, "api-train"), api_name="/launch")
    run_id = launched["run_id"]
    assert launched["name"] == "api-train"
    assert launched["command"].startswith("python -m a2po train --model ")

    runs = client.predict(api_name="/list_runs")
    assert runs[0]["id"] == run_id and runs[0]["status"] in ("queued", "running")

    status = wait_for(lambda: (s := client.predict(run_id=run_id, api_name="/status"))["status"]
                      in ("finished", "failed") and s, what="the run to end")
    assert status["status"] == "finished", status["error"]
    assert status["progress"] == 1.0 and not status["active"]
    assert status["values"]["complete"] and status["values"]["num_prompts"] == 12  # 8 train + 4 eval prompts
    assert "loss" in status["latest_metrics"] and status["latest_metrics"]["loss"]["step"] == 2
    assert status["spec"]["config"]["max_steps"] == 2
    # The run's own clock: stage 1 and 2 steps measured, nothing left.
    clock = status["clock"]
    assert clock["stage1_seconds"] > 0 and clock["train_seconds"] > 0 and clock["eval_seconds"] > 0
    assert clock["training_seconds"] < clock["stage1_seconds"] + clock["train_seconds"]  # the held-out split is out
    assert clock["remaining_seconds"] == 0
    listed = next(r for r in client.predict(api_name="/list_runs") if r["id"] == run_id)
    assert listed["clock"] == {**clock, "remaining_seconds": 0}

    rows = client.predict(run_id=run_id, after_id=0, api_name="/metrics")
    assert {"loss", "reward", "eval_accuracy"} <= {r["name"] for r in rows}
    newest = max(r["id"] for r in rows)
    assert client.predict(run_id=run_id, after_id=newest, api_name="/metrics") == []


def test_stop_resume_and_delete(client, tiny_model_dir):
    # A long run (many steps) that we stop while it works, then resume and delete.
    spec = tiny_spec(tiny_model_dir, "api-stop", max_steps=500)
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    wait_for(lambda: client.predict(run_id=run_id, api_name="/status")["status"] == "running", what="running")
    stopped = client.predict(run_id=run_id, api_name="/stop")
    assert stopped["status"] in ("stopping", "stopped")
    wait_for(lambda: client.predict(run_id=run_id, api_name="/status")["status"] == "stopped", what="stopped")

    resumed = client.predict(run_id=run_id, api_name="/resume")
    assert resumed["status"] in ("queued", "running")
    client.predict(run_id=run_id, api_name="/stop")
    wait_for(lambda: client.predict(run_id=run_id, api_name="/status")["status"] == "stopped", what="stopped again")

    assert client.predict(run_id=run_id, api_name="/delete") == {"deleted": run_id}
    assert run_id not in [r["id"] for r in client.predict(api_name="/list_runs")]


def test_bad_requests_are_errors(client, tmp_path):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="not under a model folder of this studio"):
        client.predict(spec=tiny_spec(str(tmp_path / "missing"), "bad"), api_name="/launch")
    with pytest.raises(AppError, match=r"config.beta1: beta1 must be > 0"):
        client.predict(spec={**tiny_spec(str(tmp_path), "bad"), "model": "SmolLM2-135M-Instruct",
                             "config": {"beta1": 0}}, api_name="/launch")
    with pytest.raises(AppError, match="No run #999"):
        client.predict(run_id=999, api_name="/status")
    finished = [r for r in client.predict(api_name="/list_runs") if r["status"] == "finished"]
    if finished:  # left by test_launch_status_list_and_metrics
        with pytest.raises(AppError, match="only stopped, interrupted or failed runs"):
            client.predict(run_id=finished[0]["id"], api_name="/resume")


def test_preset_none_launches_with_the_library_defaults(client, tiny_model_dir):
    from a2po.config import A2POConfig

    spec = {**tiny_spec(tiny_model_dir, "api-none"), "preset": "none", "config": {"max_steps": 1, "use_cpu": True}}
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    config = client.predict(run_id=run_id, api_name="/status")["spec"]["config"]
    defaults = A2POConfig.__dataclass_fields__
    for key in ("max_completion_length", "learning_rate", "gradient_checkpointing", "lr_scheduler_type", "seed"):
        assert config[key] == defaults[key].default, key  # 256, 5e-5, True, linear, 42: not the form's
    assert client.predict(run_id=run_id, api_name="/delete") == {"deleted": run_id}
    with pytest.raises(Exception, match=r"config.seed: seed must be a whole number from 0 to 4294967295 \(got -1\)"):
        client.predict(spec={**spec, "config": {"seed": -1}}, api_name="/launch")
