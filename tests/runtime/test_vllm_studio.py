"""A run launched from the studio with `use_vllm`: through the gate (whose allow-list finds vLLM beside the studio),
the scheduler and a real worker process, on a real SQLite file. The worker samples with vLLM and the run ends with
its V* rows, samples and metrics.

Runs in .venv-vllm (`make test-vllm`), which holds the studio's extra beside vLLM's CPU build. vLLM's CPU attention
needs a head size of 32 or more: 2 heads of 32.
"""

import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm")
pytest.importorskip("gradio", reason="the studio's extra: `make test-vllm` installs it into .venv-vllm")

from a2po.testing import make_tiny_model  # noqa: E402
from app.access.auth import Auth, User  # noqa: E402
from app.access.gate import Services  # noqa: E402
from app.access.policy import Policy  # noqa: E402
from app.runtime.devices import Devices  # noqa: E402
from app.runtime.scheduler import Scheduler  # noqa: E402
from storage import Store  # noqa: E402
from tests import helpers  # noqa: E402

PROMPTS, EVAL_SIZE, SAMPLES, STEPS = 8, 4, 4, 2
# vLLM logs this as its engine starts (vllm/v1/engine/core.py), at INFO: the worker's log shows it.
ENGINE_STARTED = "Initializing a V1 LLM engine"


def vllm_spec() -> dict:
    """A*-PO on 8 arithmetic prompts and 4 held out: stage 1 with 4 samples each, 2 steps of 4 prompts."""
    return {"name": "vllm-from-the-studio", "model": "tiny",
            "dataset": {"source": "arithmetic", "num_prompts": PROMPTS, "difficulty": 1, "operations": "+",
                        "seed": 0, "eval_size": EVAL_SIZE},
            "config": {"use_vllm": True, "use_cpu": True, "num_value_samples": SAMPLES, "max_steps": STEPS,
                       "per_device_train_batch_size": 4, "max_completion_length": 6, "filter_all_incorrect": False,
                       "gradient_checkpointing": False, "learning_rate": 1e-2, "logging_steps": 1, "seed": 0}}


def test_a_run_launched_from_the_studio_with_use_vllm_samples_with_vllm(tmp_path):
    data_dir = tmp_path / "data"
    model = data_dir / "models" / "tiny"
    make_tiny_model(model, num_heads=2, num_kv_heads=1)
    store = Store(data_dir / "studio.db")
    policy = Policy(data_dir)
    jobs = Scheduler(store, data_dir, devices=Devices(), poll_interval=0.1,
                      worker_env=policy.worker_environment({**os.environ, "VLLM_LOGGING_LEVEL": "INFO"}))
    auth = Auth.from_options(["ann:pw"], None, data_dir=data_dir)
    services = Services(store=store, scheduler=jobs, data_dir=data_dir, policy=policy, auth=auth)
    run_id, _ = services.launch_run({**vllm_spec(), "model": str(model)}, User("ann"))
    assert store.get_run(run_id)["config"]["config"]["use_vllm"] is True
    jobs.start()
    try:
        run = helpers.wait_status(store, run_id, ("finished", "failed"), timeout=900, poll=0.2)
    finally:
        jobs.close()
    assert run["status"] == "finished", run["error"]
    log = next(data_dir.rglob(f"run-{run_id}.log")).read_text(errors="replace")
    assert ENGINE_STARTED in log, log[-3000:]  # the worker sampled with vLLM, not with the native decoder

    values = store.get_values(run["value_set_id"], split=None)
    assert {v["split"] for v in values} == {"train", "eval"} and len(values) == PROMPTS + EVAL_SIZE
    assert all(len(v["completions"]) == len(v["rewards"]) == SAMPLES for v in values)
    assert sorted(m["step"] for m in store.get_metrics(run_id, names=["loss"])) == list(range(1, STEPS + 1))
    assert len(store.get_samples(run_id, split="train", limit=None)) == STEPS * 4
    assert store.get_evaluations(run_id)  # the held-out prompts, answered through vLLM too
