"""Registered rewards in the studio, through its named API against a real `python -m app` with two
`--reward-module` files and an installed entry point (a `.dist-info` on the app's PYTHONPATH): listed, picked by
`/launch`, scoring runs of a tiny model in a real worker and in a chunk, refused when not registered, recorded by
their source's hash (a resume or clone after an edit says so), and tried before launching (`/try_reward`, in the
playground's process). Every registered module records the pid of each process that imports it: never the
studio's."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from storage import Store
from tests.a2po.test_registered_rewards import REWARDS, entry_point_package, marker_pids, write
from tests.helpers import wait_for
from tests.web.test_app_api import ROOT, free_port, start_app, stop_app, tiny_spec

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ALWAYS_ZERO = REWARDS + '''

def always_zero(completions, **kwargs):
    """A broken checker: 0.0 for everything."""
    return [0.0] * len(completions)
'''
CHANGING = '''
import os

with open(os.environ["MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")


def changing_check(completions, ground_truth, **kwargs):
    """A check whose file the test edits."""
    return [0.0] * len(completions)
'''
SMALL_DATA = {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
              "eval_size": 0}


class Studio:
    def __init__(self, client: Client, pid: int, data_dir: Path, marker: Path, files: dict[str, Path]) -> None:
        self.client, self.pid, self.data_dir, self.marker, self.files = client, pid, data_dir, marker, files

    def status(self, run_id: int) -> dict:
        return self.client.predict(run_id=run_id, api_name="/status")

    def wait(self, run_id: int, *statuses: str, timeout: float = 300) -> dict:
        return wait_for(lambda: (s := self.status(run_id))["status"] in statuses and s, timeout,
                        f"run {run_id} to become {statuses}")

    def logs(self, run_id: int) -> list[dict]:
        return Store(self.data_dir / "studio.db").get_logs(run_id)


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[Studio]:
    root = tmp_path_factory.mktemp("registered-rewards")
    marker = root / "imported-by.txt"
    files = {"my_rewards": write(root / "rewards" / "my_rewards.py", ALWAYS_ZERO),
             "changing": write(root / "rewards" / "changing.py", CHANGING)}
    site = entry_point_package(root / "site")
    data_dir = root / "data"
    proc = start_app(data_dir, port := free_port(), "--model-root", tiny_model_dir,
                     "--reward-module", str(files["my_rewards"]), "--reward-module", str(files["changing"]),
                     env={"MARKER": str(marker), "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])})
    try:
        yield Studio(Client(f"http://127.0.0.1:{port}/", verbose=False), proc.pid, data_dir, marker, files)
    finally:
        stop_app(proc)
    assert proc.pid not in marker_pids(marker), "the studio's own process imported a registered module"


def spec_with(model: str, name: str, reward: str, **config) -> dict:
    return {**tiny_spec(model, name, **config), "rewards": [{"name": reward, "weight": 1.0}]}


def test_registered_rewards_are_listed_without_importing_them(studio):
    rewards = {r["name"]: r for r in studio.client.predict(api_name="/limits")["rewards"]}
    assert rewards["my_check"]["registered"] and not rewards["exact_match"]["registered"]
    assert rewards["my_check"]["doc"] == "1.0 where the completion is the answer, else 0.0. (registered: my_rewards.py)"
    assert rewards["ep_check"]["doc"].startswith("1.0 where the completion ends with the answer.")
    assert {"always_zero", "changing_check"} <= set(rewards)
    assert studio.pid not in marker_pids(studio.marker)


def test_a_reward_from_a_file_scores_a_run_in_the_worker(studio, tiny_model_dir):
    launched = studio.client.predict(spec=spec_with(tiny_model_dir, "file-reward", "my_check"), api_name="/launch")
    assert launched["warnings"] == [] and "--reward_module" in launched["command"]
    status = studio.wait(launched["run_id"], "finished", "failed")
    assert status["status"] == "finished", status["error"]
    source = status["spec"]["rewards"][0]["source"]
    path = studio.files["my_rewards"]
    assert source["file"] == str(path.resolve()) and source["function"] == "my_check"
    assert source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    names = {r["name"] for r in studio.client.predict(run_id=launched["run_id"], after_id=0, api_name="/metrics")}
    assert "rewards/my_check" in names
    pids = marker_pids(studio.marker)
    assert pids and studio.pid not in pids  # scored in the worker


def test_an_entry_point_reward_scores_a_chunked_run(studio, tiny_model_dir):
    spec = {**spec_with(tiny_model_dir, "entry-point-reward", "ep_check"), "runner": "chunked"}
    run_id = studio.client.predict(spec=spec, api_name="/launch")["run_id"]
    status = studio.wait(run_id, "finished", "failed")
    assert status["status"] == "finished", status["error"]
    assert status["spec"]["rewards"][0]["source"]["origin"] == "entry point"
    names = {r["name"] for r in studio.client.predict(run_id=run_id, after_id=0, api_name="/metrics")}
    assert "rewards/ep_check" in names
    assert studio.pid not in marker_pids(studio.marker)  # the chunk, a fork of the studio, imported it


def test_an_unregistered_reward_is_refused_with_the_registered_names(studio, tiny_model_dir):
    with pytest.raises(AppError, match=r"unknown reward 'not_registered'; known: exact_match, math_equivalence, "
                                       r"task_checker; registered: my_check, always_zero, changing_check, ep_check"):
        studio.client.predict(spec=spec_with(tiny_model_dir, "nope", "not_registered"), api_name="/launch")
    with pytest.raises(AppError, match="unknown reward 'os.system'"):  # a dotted path only when registered
        studio.client.predict(spec=spec_with(tiny_model_dir, "nope", "os.system"), api_name="/launch")


def by_kind(result: dict) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in result["rows"]:
        out.setdefault(row["kind"], []).append(row["reward"])
    return out


def test_try_the_reward_scores_the_answer_column_and_a_wrong_answer(studio, tiny_model_dir):
    spec = {"model": tiny_model_dir, "dataset": SMALL_DATA, "config": {"max_completion_length": 4}}
    for reward in ("exact_match", "my_check"):
        result = studio.client.predict(spec={**spec, "rewards": [{"name": reward}]}, api_name="/try_reward")
        kinds = by_kind(result)
        assert kinds["answer column"] == [1.0] * 8 and kinds["wrong answer"] == [0.0] * 8, result
        assert len(kinds["model sample"]) == 8  # the tiny model is at hand and cheap
        assert result["verdict"].startswith("✅ The reward tells right from wrong"), result["verdict"]
    result = studio.client.predict(spec={**spec, "rewards": [{"name": "always_zero"}]}, sample_model=False,
                                   api_name="/try_reward")
    assert "model sample" not in by_kind(result)
    assert result["verdict"].startswith("⚠ This reward gives 0 to the dataset's own answers (8 of 8 prompts)")
    with pytest.raises(AppError, match="unknown reward 'nope'"):
        studio.client.predict(spec={**spec, "rewards": [{"name": "nope"}]}, api_name="/try_reward")
    assert studio.pid not in marker_pids(studio.marker)  # scored in the playground's process


def test_a_resume_and_a_clone_say_when_the_function_changed(studio, tiny_model_dir):
    client = studio.client
    run_id = client.predict(spec=spec_with(tiny_model_dir, "changing", "changing_check", max_steps=500),
                            api_name="/launch")["run_id"]
    studio.wait(run_id, "running")
    client.predict(run_id=run_id, api_name="/stop")
    stored = studio.wait(run_id, "stopped")["spec"]
    path = studio.files["changing"]
    path.write_text(path.read_text() + "\n# edited after the run started\n")

    resumed = client.predict(run_id=run_id, api_name="/resume")
    assert len(resumed["warnings"]) == 1 and "Reward changing_check changed since it was recorded" in \
        resumed["warnings"][0] and "the resumed run scores with the current version" in resumed["warnings"][0]
    warned = [x for x in studio.logs(run_id) if x["level"] == "WARNING" and "changed since" in x["message"]]
    assert len(warned) == 1 and str(path.resolve()) in warned[0]["message"]
    client.predict(run_id=run_id, api_name="/stop")
    studio.wait(run_id, "stopped")

    clone = client.predict(spec={**stored, "name": "changing-clone"}, api_name="/launch")
    assert len(clone["warnings"]) == 1 and "changing_check changed since it was recorded" in clone["warnings"][0]
    assert any("changed since" in x["message"] for x in studio.logs(clone["run_id"]) if x["level"] == "WARNING")
    cloned = studio.status(clone["run_id"])["spec"]["rewards"][0]["source"]
    assert cloned["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()  # the clone records the current one
    client.predict(run_id=clone["run_id"], api_name="/delete")
    client.predict(run_id=run_id, api_name="/delete")
    assert studio.pid not in marker_pids(studio.marker)
