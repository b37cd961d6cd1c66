"""GRPO runs in the studio: a spec with "method": "grpo" through `/launch`, the worker, the chunked runner and a
SIGKILL-and-resume, each ending as the uninterrupted run ends (the same losses, fp32 on the CPU); no stage 1 and no
value set; the step's G completions per prompt stored with their rewards and advantages.

Real worker and chunk processes, real SQLite files, the tiny model taught half the answers (`taught_model`), so
rewards differ within a group and the advantages are not all zero; beta > 0, so every loss has a KL term.
"""

from __future__ import annotations

from collections import Counter

import pytest
from gradio_client import Client

from storage import Store
from tests import helpers
from tests.runtime.test_chunks import drive, taught_model  # noqa: F401 - a module fixture shared with the chunk tests
from tests.runtime.test_durability import finished_run, killed, make_manager, resume, wait_status
from tests.web.test_app_api import free_port, start_app, stop_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
MAX_STEPS = 6
G = 2


def grpo_spec(model: str, name: str = "grpo", runner: str = "worker", **config) -> dict:
    """12 prompts, 2 per step (G=2 completions each: a batch of 4 completions), 6 steps, a checkpoint every 2, an
    evaluation every 2 on 4 held-out prompts."""
    settings = {"num_generations": G, "per_device_train_batch_size": 2 * G, "max_completion_length": 6,
                "max_steps": MAX_STEPS, "per_device_eval_batch_size": 4, "use_cpu": True, "logging_steps": 1,
                "gradient_checkpointing": False, "seed": 0, "save_steps": 2, "eval_steps": 2, "learning_rate": 3e-3,
                "beta": 0.1, "temperature": 2.0, "loss_type": "grpo", **config}
    spec = {"name": name, "action": "train", "model": model, "method": "grpo",
            "dataset": {"source": "arithmetic", "num_prompts": 12, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 4},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings}
    if runner != "worker":
        spec["runner"] = runner
    return spec


def record(store: Store, run_id: int) -> dict:
    losses = {m["step"]: m["value"] for m in store.get_metrics(run_id, names=["loss"])}
    samples = store.get_samples(run_id, split="train", limit=None)
    return {"losses": losses, "loss_rows": len(store.get_metrics(run_id, names=["loss"])),
            "samples": Counter((s["step"], s["prompt_id"]) for s in samples),
            "sample_rows": {(s["step"], s["prompt_id"], s["sample_index"]): (s["completion"], s["reward"],
                                                                            s["advantage"]) for s in samples},
            "eval": [(e["step"], e["metrics"]["eval_accuracy"]) for e in store.get_evaluations(run_id)]}


def assert_same(run: dict, reference: dict) -> None:
    assert run["loss_rows"] == MAX_STEPS and sorted(run["losses"]) == list(range(1, MAX_STEPS + 1))
    assert any(abs(loss) > 1e-5 for loss in reference["losses"].values())  # losses that say something
    for step, loss in reference["losses"].items():
        assert run["losses"][step] == pytest.approx(loss, abs=1e-6), f"step {step}"
    assert run["samples"] == reference["samples"]  # none lost or doubled
    assert run["sample_rows"].keys() == reference["sample_rows"].keys()
    for key, (completion, reward, advantage) in reference["sample_rows"].items():
        assert run["sample_rows"][key][:2] == (completion, reward), key
        assert run["sample_rows"][key][2] == pytest.approx(advantage, abs=1e-6), key
    assert run["eval"] == reference["eval"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, taught_model) -> dict:  # noqa: F811
    """A GRPO run in one worker process, never interrupted."""
    store, run = finished_run(tmp_path_factory.mktemp("grpo-worker"), grpo_spec(taught_model, "worker"))
    assert run["value_set_id"] is None  # no stage 1, no V* set
    assert not [m for m in (r["message"] for r in store.get_logs(run["id"])) if m.startswith("Stage 1")]
    names = {m["name"] for m in store.get_metrics(run["id"])}
    assert {"loss", "reward", "kl", "completion_tokens", "peak_memory_gb", "frac_reward_zero_std"} <= names
    return record(store, run["id"])


def test_grpo_samples_hold_every_completion_of_a_group_with_its_advantage(reference):
    # Every prompt of every step has its G completions, and a group's advantages are centred (A = r - mean, scaled).
    assert set(reference["samples"].values()) == {G}
    assert len(reference["samples"]) == MAX_STEPS * 2
    groups: dict = {}
    for (step, prompt_id, index), (_, reward, advantage) in reference["sample_rows"].items():
        groups.setdefault((step, prompt_id), []).append((index, reward, advantage))
    assert all(sorted(i for i, _, _ in group) == list(range(G)) for group in groups.values())
    assert all(sum(a for _, _, a in group) == pytest.approx(0.0, abs=1e-5) for group in groups.values())
    mixed = [g for g in groups.values() if len({r for _, r, _ in g}) > 1]
    assert mixed and all(max(g, key=lambda x: x[1])[2] > 0 for g in mixed)  # the better completion is pushed up
    # Before training, every eval_steps (2) and at the end: points between "before" and "after".
    assert [step for step, _ in reference["eval"]] == [0, 2, 4, 6]


def test_grpo_killed_mid_step_and_resumed_ends_like_an_uninterrupted_run(tmp_path, taught_model,  # noqa: F811
                                                                          reference):
    store, manager = make_manager(tmp_path / "data", "train_step@3=kill")
    run_id = manager.submit(grpo_spec(taught_model, "killed"))
    manager.start()
    try:
        killed(wait_status(store, run_id, ("failed", "finished"), timeout=240))
        assert store.latest_checkpoint(run_id)["step"] == 2
        run = resume(store, manager, run_id)
        assert run["status"] == "finished", run["error"]
        logs = [r["message"] for r in store.get_logs(run_id)]
        assert any("resuming stage 2 from" in m and m.endswith("checkpoint-2.") for m in logs), logs
        assert_same(record(store, run_id), reference)
    finally:
        manager.close()


def test_grpo_on_the_chunked_runner_ends_like_one_worker(tmp_path, taught_model, reference):  # noqa: F811
    # Budget ~0: every chunk trains one step in a freshly forked process that restores the run from disk.
    store, manager = make_manager(tmp_path / "data", chunk_seconds=0.01)
    run_id = manager.submit(grpo_spec(taught_model, "chunked", runner="chunked"))
    try:
        run = drive(manager, store, run_id, lambda r: r["status"] in ("finished", "failed"), timeout=300)
        assert run["status"] == "finished", run["error"]
        assert run["chunks_done"] >= MAX_STEPS and run["value_set_id"] is None
        assert_same(record(store, run_id), reference)
    finally:
        manager.close()


def test_a_grpo_run_and_a_pair_through_the_api(tmp_path, tiny_model_dir):
    proc = start_app(tmp_path / "studio", free_port(), "--model-root", tiny_model_dir, "--public", "--auth", "ann:pw")
    try:
        url = f"http://127.0.0.1:{proc.args[proc.args.index('--port') + 1]}/"
        token = Client(url, verbose=False).predict(username="ann", password="pw", api_name="/login")["token"]
        client = Client(url, verbose=False, headers={"x-a2po-token": token})
        spec = grpo_spec(tiny_model_dir, "api", max_steps=2, save_steps=0, eval_steps=0)
        # The public limits bound G as they bound N, and GRPO's batch (completions) by its prompts per step.
        with pytest.raises(Exception, match="G: completions per prompt per step must be at most 16"):
            client.predict(spec={**spec, "config": {**spec["config"], "num_generations": 32,
                                                    "per_device_train_batch_size": 64}}, api_name="/launch")
        with pytest.raises(Exception, match="is 128 prompts per step, and this studio allows at most 64"):
            client.predict(spec={**spec, "config": {**spec["config"], "per_device_train_batch_size": 256}},
                           api_name="/launch")
        with pytest.raises(Exception, match="is a setting of A.-PO runs, not of GRPO runs"):
            client.predict(spec={**spec, "config": {**spec["config"], "num_value_samples": 4}}, api_name="/launch")
        run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
        status = helpers.wait_for(lambda: (s := client.predict(run_id=run_id, api_name="/status"))["status"] in (
            "finished", "failed") and s, 180, "the GRPO run to end")
        assert status["status"] == "finished", status["error"]
        assert status["spec"]["method"] == "grpo" and status["spec"]["config"]["num_generations"] == G
        assert status["values"] is None  # no stage 1
        store = Store(tmp_path / "studio" / "studio.db")
        names = {m["name"] for m in store.get_metrics(run_id)}
        assert {"loss", "completion_tokens", "peak_memory_gb", "kl"} <= names
        assert len(store.get_samples(run_id, split="train", limit=None)) == 2 * 2 * G  # 2 steps, 2 prompts, G each
        assert store.get_evaluations(run_id)  # held-out accuracy before and after

        # "A*-PO vs GRPO" through the API: matched settings, both queued.
        a2po = {"name": "pair", "model": tiny_model_dir, "dataset": spec["dataset"],
                "config": {"num_value_samples": 4, "per_device_train_batch_size": 2, "max_steps": 2,
                           "max_completion_length": 4, "learning_rate": 1e-4, "use_cpu": True,
                           "filter_all_incorrect": False}}
        pair = client.predict(spec=a2po, api_name="/launch_pair")
        first, second = (store.get_run(pair[m]["run_id"]) for m in ("a2po", "grpo"))
        one, two = first["config"], second["config"]
        assert one.get("method", "a2po") == "a2po" and two["method"] == "grpo"
        assert (first["name"], second["name"]) == ("pair-a2po", "pair-grpo")
        assert pair["protocol"] == "paper" and one["study"]["id"] == two["study"]["id"] == pair["study"]
        assert two["config"]["num_generations"] == 4 and two["config"]["per_device_train_batch_size"] == 8
        for key in ("learning_rate", "lr_scheduler_type", "max_steps", "num_train_epochs", "max_completion_length",
                    "eval_steps", "seed", "temperature"):
            assert one["config"][key] == two["config"][key], key
        assert one["config"]["eval_steps"] == 1  # 2 steps, 8 points at most: every step, one grid for both
        # Only an A*-PO spec makes a pair, and G = N needs N >= 2: each refused with what to change.
        with pytest.raises(Exception, match="starts from an A\\*-PO spec"):
            client.predict(spec={**a2po, "method": "grpo"}, api_name="/launch_pair")
        with pytest.raises(Exception, match="N \\(num_value_samples\\) >= 2"):
            client.predict(spec={**a2po, "config": {**a2po["config"], "num_value_samples": 1}},
                           api_name="/launch_pair")
        assert one["model"] == two["model"] and one["dataset"] == two["dataset"] and one["rewards"] == two["rewards"]
        for run in (first, second):
            client.predict(run_id=run["id"], api_name="/delete")
        # Seeds: one run per seed, as one study.
        seeded = client.predict(spec={**a2po, "name": "seeded"}, seeds=[3, 4], api_name="/launch")
        runs = [store.get_run(i) for i in seeded["run_ids"]]
        assert [(r["name"], r["config"]["config"]["seed"]) for r in runs] == [("seeded-s3", 3), ("seeded-s4", 4)]
        assert {r["config"]["study"]["id"] for r in runs} == {seeded["study"]}
        for run in runs:
            client.predict(run_id=run["id"], api_name="/delete")
    finally:
        stop_app(proc)


def test_a_pair_is_launched_whole_or_not_at_all(tmp_path, tiny_model_dir):
    from dataclasses import replace

    from app.access.auth import LOCAL_USER
    from app.access.gate import Refused, Services
    from app.access.policy import PUBLIC_LIMITS, Policy
    from app.runtime.scheduler import Scheduler

    store = Store(tmp_path / "studio.db")
    scheduler = Scheduler(store, tmp_path)  # never started: the runs stay queued
    policy = Policy(tmp_path, limits=replace(PUBLIC_LIMITS, queue_size=1), model_roots=[tiny_model_dir])
    services = Services(store, scheduler, tmp_path, policy=policy)
    spec = {"name": "pair", "model": tiny_model_dir, "config": {"max_steps": 2, "use_cpu": True}}
    try:
        with pytest.raises(Refused, match="This study asks for 2 runs, and the queue holds 1 more.*none was started"):
            services.launch_pair(spec, LOCAL_USER)
        assert store.list_runs() == []
        # G = N: the limit on N bounds the GRPO run's G too; nothing is queued.
        with pytest.raises(Refused, match="N: reference samples per prompt must be at most 16"):
            services.launch_pair({**spec, "config": {**spec["config"], "num_value_samples": 32}}, LOCAL_USER)
        assert store.list_runs() == []
    finally:
        scheduler.close()
