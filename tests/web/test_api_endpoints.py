"""The named API's endpoint functions (`app.web.api`), called directly on a real Store and scheduler (not started:
runs stay queued) without a server: what each returns, refusals as the errors a client reads, and that
`register_api` names each endpoint after its function with its documented, typed parameters."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import gradio as gr
import pytest

from app.access.auth import Auth
from app.access.gate import Services
from app.access.policy import Policy
from app.runtime.devices import Devices
from app.runtime.scheduler import Scheduler
from app.web import api
from storage import Store


def spec(model: str, name: str, **config) -> dict:
    return {"name": name, "action": "train", "model": model,
            "dataset": {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 4},
            "config": {"num_value_samples": 4, "max_completion_length": 8, "max_steps": 2, "use_cpu": True,
                       "per_device_train_batch_size": 4, **config}}


@pytest.fixture
def services(tmp_path, tiny_model_dir):
    store = Store(tmp_path / "studio.db")
    policy = Policy(tmp_path, model_roots=(Path(tiny_model_dir),))
    yield Services(store, Scheduler(store, tmp_path, devices=Devices()), tmp_path, policy=policy, auth=Auth())
    store.close()


def test_a_run_launched_read_stopped_resumed_and_deleted_through_the_endpoints(services, tiny_model_dir):
    launched = api.launch(services, spec(tiny_model_dir, "direct"))
    run_id = launched["run_id"]
    assert launched["name"] == "direct" and "a2po" in launched["command"]
    status = api.status(services, run_id)
    assert status["status"] == "queued" and status["active"] and status["kind"] == "train"
    assert status["spec"]["config"]["max_steps"] == 2 and status["clock"]["remaining_seconds"] is None
    assert [r["id"] for r in api.list_runs(services)] == [run_id]
    assert api.metrics(services, run_id) == []
    services.store.add_metrics(run_id, 1, {"loss": 0.5})
    rows = api.metrics(services, run_id)
    assert [(r["step"], r["name"], r["value"]) for r in rows] == [(1, "loss", 0.5)]
    assert api.metrics(services, run_id, after_id=rows[-1]["id"]) == []
    assert api.stop(services, run_id, request=None)["status"] in ("stopping", "stopped")
    assert api.resume(services, run_id, request=None)["status"] == "queued"
    assert api.delete(services, run_id, request=None) == {"deleted": run_id}
    with pytest.raises(gr.Error, match=f"No run #{run_id}"):
        api.status(services, run_id)


def test_refusals_are_errors_that_name_the_problem(services, tiny_model_dir, tmp_path):
    with pytest.raises(gr.Error, match="beta1"):
        api.launch(services, spec(tiny_model_dir, "bad", beta1=0))
    with pytest.raises(gr.Error, match="budget"):
        api.launch_pair(services, spec(tiny_model_dir, "pair"), protocol="time", budget_minutes=-1)
    with pytest.raises(gr.Error, match="No run #999"):
        api.metrics(services, 999)
    with pytest.raises(gr.Error, match="no password users"):
        api.login(services, "someone", "secret")
    with pytest.raises(gr.Error, match="Send a file"):
        api.upload_dataset(services, None, request=None)
    assert services.store.list_runs() == []  # nothing was queued


def test_a_seeded_launch_is_one_study(services, tiny_model_dir):
    launched = api.launch(services, spec(tiny_model_dir, "seeded"), seeds=[0, 1])
    assert len(launched["run_ids"]) == 2 and launched["run_id"] == launched["run_ids"][0]
    studies = {services.store.get_run(i)["config"]["study"]["id"] for i in launched["run_ids"]}
    assert studies == {launched["study"]}


def test_limits_and_an_uploaded_file(services, tmp_path):
    limits = api.limits(services)
    assert limits["login_required"] is False and "learning_rate" in limits["settable"]
    assert limits["runs_go_to"]["backend"] == "local"
    data = tmp_path / "incoming" / "tiny.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"prompt": "What is 1+1?", "answer": "2"}) + "\n")
    stored = api.upload_dataset(services, str(data), request=None)["file"]
    assert (services.policy.datasets_dir / stored).read_text() == data.read_text()


def test_each_endpoint_is_registered_under_its_name_with_its_parameters(services):
    with gr.Blocks() as demo:
        api.register_api(services)
    named = demo.get_api_info()["named_endpoints"]
    for endpoint in [e for e, _ in api.ENDPOINTS] + [api.upload_dataset]:
        parameters = [name for name in inspect.signature(endpoint).parameters if name not in ("services", "request")]
        found = named[f"/{endpoint.__name__}"]
        assert [p["parameter_name"] for p in found["parameters"]] == parameters, endpoint.__name__
        assert found["description"].split()[:3] == endpoint.__doc__.split()[:3], endpoint.__name__
    assert set(named) == {f"/{e.__name__}" for e, _ in api.ENDPOINTS} | {"/upload_dataset"}


def test_the_studio_lists_exactly_the_named_endpoints(services):
    """The whole studio (every page) lists the endpoints of `ENDPOINTS` and nothing else: a page's own event that is
    not private (an unnamed /lambda_N) would be an API endpoint and an agent's MCP tool. Guards every future page."""
    from app.web import build_demo

    named = build_demo(services).get_api_info()["named_endpoints"]
    assert set(named) == {f"/{e.__name__}" for e, _ in api.ENDPOINTS} | {"/upload_dataset"}


def test_every_endpoint_documents_its_arguments_for_agents():
    """MCP tools take their argument descriptions from the docstrings' `Args:` lines (one line each)."""
    from gradio.utils import get_function_description

    for endpoint in [e for e, _ in api.ENDPOINTS] + [api.upload_dataset]:
        description, parameters, _ = get_function_description(endpoint)
        assert len(description) > 40, endpoint.__name__
        undocumented = [name for name, text in parameters.items() if name not in ("services", "request") and not text]
        assert not undocumented, f"{endpoint.__name__}: {undocumented}"


def test_compare_study_and_completions_read_runs_back(services, tiny_model_dir):
    launched = api.launch(services, spec(tiny_model_dir, "seeded"), seeds=[0, 1])
    ids, study_id = launched["run_ids"], launched["study"]
    assert api.study(services) == {"studies": [{"id": study_id, "label": api.study(services)["studies"][0]["label"]}]}
    read = api.study(services, study_id)
    assert read["kind"] == "seeds" and [r["run_id"] for r in read["runs"]] == ids and read["active"] == ids
    assert read["verdict"] is None and read["best"] is None  # one method, no sweep
    with pytest.raises(gr.Error, match="No study 'nothing'"):
        api.study(services, "nothing")

    compared = api.compare(services, ids)
    assert compared["run_ids"] == ids and "GRPO" in compared["verdict"] and "**" not in compared["verdict"]
    with pytest.raises(gr.Error, match="Give the ids"):
        api.compare(services, [])
    with pytest.raises(gr.Error, match="No run #999"):
        api.compare(services, [ids[0], 999])

    services.store.add_samples(ids[0], [
        {"step": step, "split": "train", "prompt_id": f"p{i}", "prompt_text": f"What is {i}+1?",
         "completion": str(i + 1), "reward": float(i % 2), "v_star": 0.5, "advantage": 0.1}
        for step in (1, 2) for i in range(3)])
    written = api.completions(services, ids[0], limit=4)
    assert written["steps"] == [1, 2] and len(written["rows"]) == 4 and written["rows"][0]["step"] == 2
    assert set(written["rows"][0]) == set(api.COMPLETION_KEYS)
    assert {r["step"] for r in api.completions(services, ids[0], step=1)["rows"]} == {1}
    assert [r["completion"] for r in api.completions(services, ids[0], step=1, correct=True)["rows"]] == ["2"]
    with pytest.raises(gr.Error, match="limit must be a whole number from 1 to 200"):
        api.completions(services, ids[0], limit=0)


def test_a_pair_whose_grpo_side_runs_a_named_recipe(services, tiny_model_dir):
    recipes = api.limits(services)["grpo_recipes"]
    assert {"dapo", "dr-grpo", "gspo"} <= set(recipes) and "arXiv 2503.14476" in recipes["dapo"]
    pair = api.launch_pair(services, spec(tiny_model_dir, "duel"), grpo_recipe="dr-grpo")
    grpo = services.store.get_run(pair["grpo"]["run_id"])["config"]
    assert grpo["recipe"] == "dr-grpo"
    assert grpo["config"]["loss_type"] == "dr_grpo" and grpo["config"]["scale_rewards"] == "none"
    with pytest.raises(gr.Error, match="Unknown GRPO recipe 'ppo'"):
        api.launch_pair(services, spec(tiny_model_dir, "duel-2"), grpo_recipe="ppo")
    assert len(services.store.list_runs()) == 2  # the refused pair queued nothing
