"""`python -m a2po sweep` started again, and the honesty of its table (issue 35, items 9 and 11): finished runs are
known by their whole spec, a folder refuses other base flags, ties are marked as ties, and every run that reads a
V* set is charged its stage 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from a2po.sweep import format_table

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]


def _row(point: str, final: float | None) -> dict:
    return {"point": point, "seeds": 1, "final_accuracy": final, "final_min": final, "final_max": final,
            "best_accuracy": final, "best_step": 2, "training_seconds": 3.0, "completion_tokens": 40}


def test_the_table_marks_a_tie_at_the_best_as_a_tie_and_a_single_best_with_a_star():
    tied = format_table([_row("beta2=0.001", 0.5), _row("beta2=0.01", 0.5), _row("beta2=0.1", 0.25)]).splitlines()
    assert [line[0] for line in tied[1:4]] == ["=", "=", " "]
    assert "= 2 grid points tie for the best final median (50.0%)" in tied[4]
    single = format_table([_row("beta2=0.001", 0.5), _row("beta2=0.01", 0.75)]).splitlines()
    assert [line[0] for line in single[1:3]] == [" ", "*"] and "* the best final median" in single
    assert any("charged in full to every run that reads it" in line for line in single)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_model_dir) -> tuple[list[str], dict, subprocess.CompletedProcess]:
    """A finished sweep of two grid points on one stage 1: its command, environment and result."""
    out = tmp_path_factory.mktemp("cli-sweep") / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "a2po", "sweep", "--model", tiny_model_dir, "--grid", "beta2=0.001,0.01",
            "--num_prompts", "8", "--eval_size", "4", "--num_value_samples", "2", "--max_completion_length", "4",
            "--per_device_train_batch_size", "4", "--max_steps", "1", "--use_cpu", "true", "--save_strategy", "no",
            "--filter_all_incorrect", "false", "--output_dir", str(out), "--run_name", "cli"]
    first = subprocess.run(args, cwd=out.parent, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    return args, env, first


def test_every_run_of_a_sweep_is_charged_the_stage_one_it_reads(swept):
    args, _, first = swept
    out = Path(args[args.index("--output_dir") + 1])
    sampled, reused = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert sampled["stage1_tokens"] > 0 and reused["stage1_tokens"] == 0  # one stage 1 for both runs
    assert reused["completion_tokens"] > sampled["stage1_tokens"]  # the run that read it pays for it too
    for row in (sampled, reused):
        assert row["completion_tokens"] == sampled["stage1_tokens"] + row["train_tokens"]
        assert row["training_seconds"] - row["train_seconds"] == pytest.approx(sampled["stage1_seconds"], abs=0.02)
    assert "charged in full to every run that reads it" in first.stdout


def test_a_sweep_folder_refuses_other_flags_naming_them_and_skips_its_own_finished_runs(swept):
    args, env, _ = swept
    out = Path(args[args.index("--output_dir") + 1])
    other = subprocess.run([*args, "--max_steps", "3"], cwd=out.parent, env=env, capture_output=True, text=True,
                           timeout=300)
    assert other.returncode != 0 and "done earlier" not in other.stdout, other.stdout[-2000:]
    assert "--max_steps 1 there, 3 now" in other.stderr and "another --output_dir" in other.stderr
    assert len((out / "sweep.jsonl").read_text().splitlines()) == 2
    again = subprocess.run(args, cwd=out.parent, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done earlier") == 2, again.stderr[-2000:]


def test_a_grid_name_given_twice_with_spaces_is_refused_naming_it():
    from a2po.sweep import GridError, parse_grid

    with pytest.raises(GridError, match="'beta2' is given twice"):
        parse_grid({"beta2": [0.001], " beta2 ": [0.01]})


def test_a_sweep_refuses_resume_from_checkpoint_before_writing_anything(tmp_path, tiny_model_dir):
    from a2po.sweep import run_sweep

    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="drop --resume_from_checkpoint"):
        run_sweep(["--model", tiny_model_dir, "--grid", "beta2=0.001,0.01", "--output_dir", str(out),
                   "--resume_from_checkpoint", str(tmp_path)])
    assert not out.exists()
