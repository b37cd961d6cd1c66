"""Registered rewards a lab meets (issue 28): a reward file edited after launch is named in the run's log as the
version that scored it, with a warning, and Compare says when two runs were scored by different versions; a dotted
path given to `python -m app --reward-module` is refused with the file to give instead."""

from __future__ import annotations

import hashlib

import pytest

from a2po.reward_registry import stamp_sources
from app.__main__ import register_rewards
from app.runtime.reward_versions import scored_by, versions_note
from tests.runtime.test_durability import durable_spec, make_manager, wait_status

VERSION = '''
def graded(completions, **kwargs):
    """Scores every completion {score}."""
    return [{score} for _ in completions]
'''


def test_a_reward_file_edited_after_launch_is_named_as_the_version_that_scored(tmp_path, tiny_model_dir,
                                                                                monkeypatch):
    rewards = tmp_path / "graded.py"
    rewards.write_text(VERSION.format(score=1.0))
    launched = hashlib.sha256(rewards.read_bytes()).hexdigest()
    monkeypatch.setenv("A2PO_REWARD_MODULES", str(rewards))
    spec = {**durable_spec(tiny_model_dir, "edited"), "action": "values"}
    spec["rewards"], _ = stamp_sources([{"name": "graded", "weight": 1.0}])  # as the gate stamps it at launch
    store, manager = make_manager(tmp_path / "data")
    run_id = manager.submit(spec)
    assert store.get_run(run_id)["config"]["rewards"][0]["source"]["sha256"] == launched
    rewards.write_text(VERSION.format(score=0.0))  # edited before the worker starts
    edited = hashlib.sha256(rewards.read_bytes()).hexdigest()
    manager.start()
    try:
        run = wait_status(store, run_id, ("finished", "failed"), timeout=300)
    finally:
        manager.close()
    assert run["status"] == "finished", run["error"]
    warnings = [r["message"] for r in store.get_logs(run_id) if r["level"] == "WARNING"]
    assert any(m.startswith("Reward graded changed since launch") and edited[:12] in m and launched[:12] in m
               for m in warnings), warnings
    assert scored_by(store, store.get_run(run_id)) == {"graded": {edited}}
    # Its pair partner, launched and scored before the edit: Compare says the two differ (under the verdict).
    spec["name"] = "partner"
    partner = manager.submit(spec)  # never started: its stamp is the version it would be scored by
    runs = [store.get_run(run_id), store.get_run(partner)]
    note = versions_note(store, runs)
    assert "`graded` was scored by different versions" in note and edited[:12] in note and launched[:12] in note
    assert versions_note(store, runs[:1]) == ""
    store.close()


def test_a_dotted_reward_module_is_refused_with_the_file_to_give(tmp_path, monkeypatch):
    package = tmp_path / "my_lib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text(VERSION.format(score=1.0))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # found from the studio's folder, as `python -m app` finds it
    monkeypatch.setenv("A2PO_REWARD_MODULES", "")
    with pytest.raises(SystemExit, match=r"--reward-module my_lib\.rewards\.graded: a dotted path .* workers run "
                                         rf"elsewhere .* \(here: {package / 'rewards.py'}; .*e\.g\. graded\)"):
        register_rewards(["my_lib.rewards.graded"])
    assert "graded" in register_rewards([str(package / "rewards.py")])  # the fix it names
