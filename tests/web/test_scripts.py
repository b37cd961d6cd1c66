"""Every script in scripts/ and every measurement harness in benchmarks/ starts: `--help` (its own options), or a
tiny run where one is cheap; and `benchmarks.harness.studio`, the one launcher they share, names a studio that
will not start. A studio it serves is covered by `tests/browser/test_run_page_browser.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import studio

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]
# Each script and an option only its own parser knows: its `--help` printing it shows the script ran to its parser.
SCRIPTS = {
    "app_latency.py": "--seed",
    "click_train.py": "--screenshot",
    "compare_methods.py": "--protocol",
    "kill_resume.py": "--kill-after-step",
    "playground_latency.py": "--warmup",
    "ray_latency.py": "--trials",
    "recipe_search.py": "--dry-run",
    "screenshots.py": "--duel",
    "teaching_demo.py": "--seeds",
    "vllm_sampling_mismatch.py": "--top-k",
}
HARNESSES = {"benchmarks.polling_cost": "--sessions", "benchmarks.store": "--plan"}
TESTED_APART = {"gpu_check.sh": "tests/a2po/test_gpu_check.py", "chunk_overhead.py": "tests/runtime/test_chunk_cost.py",
                "cluster_demo.sh": "test_cluster_demo_answers_help_and_refuses_an_unknown_option_..., below"}


def run(*command: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_every_script_has_a_smoke_test():
    found = sorted(path.name for path in (ROOT / "scripts").iterdir() if path.is_file())
    assert found == sorted([*SCRIPTS, *TESTED_APART]), "a new script needs a line in SCRIPTS (its --help)"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_answers_help(script, tmp_path):
    # From another folder, as a user may start it: nothing may rely on the checkout being the working directory.
    result = run(sys.executable, str(ROOT / "scripts" / script), "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage:") and SCRIPTS[script] in result.stdout, result.stdout


@pytest.mark.parametrize("module", sorted(HARNESSES))
def test_harness_answers_help(module):
    result = run(sys.executable, "-m", module, "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert HARNESSES[module] in result.stdout, result.stdout


def test_cluster_demo_answers_help_and_refuses_an_unknown_option_before_touching_anything(tmp_path):
    script = str(ROOT / "scripts" / "cluster_demo.sh")
    assert run("bash", "-n", script).returncode == 0
    shown = run("bash", script, "--help", cwd=tmp_path)
    assert shown.returncode == 0 and "scripts/cluster_demo.sh [WORK_DIR] [--quick]" in shown.stdout, shown.stderr
    refused = run("bash", script, "--qiuck", cwd=tmp_path)
    assert refused.returncode == 2 and "unknown option --qiuck" in refused.stderr
    assert refused.stdout == ""  # no step started: it did not take the option for its work folder


def test_compare_methods_report_names_a_missing_study(tmp_path):
    result = run(sys.executable, str(ROOT / "scripts" / "compare_methods.py"), str(tmp_path), "--report",
                 "--name", "nothing-yet")
    assert result.returncode == 1
    assert "No study named 'nothing-yet' in this data folder: run it first (without --report)." in result.stderr


def test_compare_methods_refuses_an_unknown_grpo_recipe_before_starting_a_studio(tmp_path):
    result = run(sys.executable, str(ROOT / "scripts" / "compare_methods.py"), str(tmp_path / "data"),
                 "--grpo-recipe", "dapp")
    assert result.returncode == 2 and "--grpo-recipe: Unknown GRPO recipe 'dapp': use one of dapo" in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("flags, rung_zero, most", [
    # A*-PO: 4 batches x 2 learning rates x 3 selections; GRPO: 2 recipes x 2 learning rates x 3 batches. Halved by 3
    # over 3 rungs: 24 -> 8 -> 2 points (the last with 3 seeds), 6 -> 2 -> 1 for each recipe.
    ((), 24 + 2 * 6, (24 + 8 + 2 * 3) + 2 * (6 + 2 + 3)),
    (("--a2po-batch", "8", "32", "--lrs", "1e-5", "--seeds", "0", "--recipes", "dapo"), 6 + 3,
     (6 + 2 + 1) + (3 + 1 + 1)),
])
def test_recipe_search_dry_run_lists_its_runs_without_starting_a_studio(tmp_path, flags, rung_zero, most):
    data_dir = tmp_path / "data"
    result = run(sys.executable, str(ROOT / "scripts" / "recipe_search.py"), str(data_dir), "--dry-run", *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    listed = [line for line in result.stdout.splitlines() if line.startswith("  recipe-search-")]
    assert len(listed) == len(set(listed)) == rung_zero and all(line.endswith("-r0") for line in listed)
    assert f"at most {most} runs in" in result.stdout and "4e+13 FLOPs each at the last rung" in result.stdout
    assert not data_dir.exists()


@pytest.mark.parametrize("task", ["teaching", "basic_arithmetic"])
def test_recipe_search_reports_a_committed_results_file_as_the_docs_table(task):
    import json
    import statistics

    results = ROOT / "benchmarks" / "results" / f"recipe_search_{task}.json"
    result = run(sys.executable, str(ROOT / "scripts" / "recipe_search.py"), str(results), "--report")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| recipe-search-")]
    found = json.loads(results.read_text())
    assert len(rows) == sum(len(study["rows"]) for study in found["studies"].values()) > 0
    assert all(line.count("|") == 12 for line in rows)  # the eleven columns of docs/benchmarks.md's table
    # Each point's path through the rungs: its median final accuracy at the end of every rung it ran.
    listed = [row for study in found["studies"].values() for row in study["rows"]]
    assert any(len(row["rungs"]) > 1 for row in listed)
    for line, row in zip(rows, listed, strict=True):
        medians = [statistics.median(finals) for finals in row["rungs"]]
        assert line.split(" | ")[5] == (" → ".join(f"{100 * m:.1f}%" for m in medians) or "–"), line


def test_studio_that_exits_at_start_is_named_with_its_output(tmp_path):
    with pytest.raises(RuntimeError) as failed, studio(tmp_path, "--no-such-option", timeout=120):
        raise AssertionError("a studio with an unknown option served")
    message = str(failed.value)
    assert "python -m app exited with code 2" in message
    assert "--no-such-option" in message and str(tmp_path / "server.log") in message


def test_recipe_search_keeps_its_duels_in_the_results_file_and_reports_them_from_it(tmp_path, monkeypatch):
    # A duel as the studio stores it (the script's own `/launch_pair` request through the studio's `study_specs`), its
    # runs finished with held-out answers in a real SQLite file: read back, kept in the results file, reported from it.
    import importlib.util
    import json

    from app.studies.protocols import study_specs
    from storage import Store, lifecycle

    loaded = importlib.util.spec_from_file_location("recipe_search", ROOT / "scripts" / "recipe_search.py")
    search = importlib.util.module_from_spec(loaded)
    monkeypatch.setitem(sys.modules, "recipe_search", search)  # its dataclasses look their module up
    loaded.loader.exec_module(search)
    parsed = search.parse_options([str(tmp_path), "--duel-seeds", "3", "4"])
    found = {"best": {"a2po": {"point": {"per_device_train_batch_size": 64, "learning_rate": 3e-5,
                                         "pass_rate_band": [0.125, 1.0]}},
                      "grpo": {"recipe": "dr_grpo", "point": {"per_device_train_batch_size": 32,
                                                               "learning_rate": 3e-5}}}}
    request = search.duel_request(parsed, found)
    assert request["seeds"] == [3, 4] and request["protocol"] == "compute"  # fresh seeds, not the search's 0, 1, 2
    assert "values_seed" not in request["spec"]["config"]  # each seed's own stage 1, counted in FLOPs
    # At equal time a V* set the compute duel sampled (the same seeds) would be charged the seconds it took on a
    # machine that duel may have shared: the time duel's A*-PO runs sample one of their own, none of their GRPO runs.
    timed = search.duel_request(search.parse_options([str(tmp_path), "--duel", "--protocol", "time"]), found)
    assert timed["budget_minutes"] == 4.0 and timed["spec"]["config"]["values_seed"] == search.TIME_DUEL_VALUES_SEED
    timed_specs = study_specs(timed["spec"], timed["seeds"], pair=True, protocol="time",
                              budget_seconds=60 * timed["budget_minutes"], grpo_recipe=timed["grpo_recipe"],
                              grpo_settings=timed["grpo_settings"])
    assert {s["config"].get("values_seed") for s in timed_specs if s.get("method", "a2po") == "a2po"} == {1000}
    assert all("values_seed" not in s["config"] for s in timed_specs if s.get("method") == "grpo")
    store = Store(tmp_path / "studio.db")
    right = {"a2po": [1.0] * 30 + [0.0] * 10, "grpo": [1.0] * 20 + [0.0] * 20}  # 75% against 50% on 40 prompts
    for spec in study_specs(request["spec"], request["seeds"], pair=True, protocol="compute",
                            budget_flops=request["budget_flops"], grpo_recipe=request["grpo_recipe"],
                            grpo_settings=request["grpo_settings"]):
        run_id = store.create_run(spec["name"], "train", spec)
        method = spec.get("method", "a2po")
        for step, accuracy in ((0, 0.0), (8, sum(right[method]) / 40)):
            store.add_evaluation(run_id, step, {"eval_accuracy": accuracy, "train_seconds": 30.0 * step,
                                                "train_flops": 5e12 * step})
        store.add_samples(run_id, [{"step": 8, "split": "eval", "prompt_id": f"p{i}", "completion": "", "reward": r}
                                   for i, r in enumerate(right[method])])
        store.apply(run_id, lifecycle.CLAIM)
        store.apply(run_id, lifecycle.FINISH)
    duels = search.read_duels(parsed, store)
    assert len(duels) == 1 and duels[0]["seeds"] == [3, 4]
    assert (duels[0]["methods"]["a2po"]["final"], duels[0]["methods"]["grpo"]["final"]) == (0.75, 0.5)
    assert duels[0]["difference"]["points"] == pytest.approx(25.0) and duels[0]["difference"]["seeds"] == 2
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"studies": {}, "best": {}, "duels": duels}))
    shown = run(sys.executable, str(ROOT / "scripts" / "recipe_search.py"), str(results), "--report")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "### A*-PO vs GRPO, compute protocol, each method at its best point" in shown.stdout
    assert "| A*-PO | 75.0% (75.0%–75.0%) |" in shown.stdout and "| GRPO | 50.0% (50.0%–50.0%) |" in shown.stdout
    assert "**A\\*-PO − GRPO: +25.0 points**" in shown.stdout and "seeds 3, 4;" in shown.stdout
