"""`python -m a2po` in a real subprocess, and a two-process run under `accelerate launch`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from a2po.runspec import RunSpec
from a2po.values import load_optimal_values

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


TINY_RUN = ["--dataset", "arithmetic", "--num_prompts", "8", "--eval_size", "4", "--reward", "exact_match",
            "--num_value_samples", "2", "--max_completion_length", "4", "--per_device_train_batch_size", "4",
            "--max_steps", "2", "--use_cpu", "true", "--disable_tqdm", "false", "--save_strategy", "no",
            "--filter_all_incorrect", "false"]  # a random tiny model never solves arithmetic


ROOT = Path(__file__).resolve().parents[2]


def run(args, cwd, timeout=300):
    # PYTHONPATH: the package of this tree, wherever the environment's editable install points.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "a2po", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_train_with_yaml_config_then_values(tmp_path, tiny_model_dir):
    (tmp_path / "run.yaml").write_text("learning_rate: 0.01\nbeta2: 0.002\nlogging_steps: 1\n")
    out = tmp_path / "out"
    result = run(["train", "--model", tiny_model_dir, "--config", str(tmp_path / "run.yaml"), "--beta2", "0.003",
                  "--output_dir", str(out), *TINY_RUN], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Output directory: {out.resolve()}" in result.stdout
    assert "Stage 1: V* (train)" in result.stderr  # progress bar for stage 1
    assert (out / "model.safetensors").exists()
    final = json.loads([line for line in result.stdout.splitlines() if line.startswith('{"eval_accuracy"')][-1])
    assert 0.0 <= final["eval_accuracy"] <= 1.0
    saved = torch.load(out / "training_args.bin", weights_only=False)
    assert (saved.learning_rate, saved.beta2) == (0.01, 0.003)  # YAML value, and a flag overriding the YAML

    values_out = tmp_path / "values"
    result = run(["values", "--model", tiny_model_dir, "--output_dir", str(values_out), *TINY_RUN], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    table = load_optimal_values(values_out / "optimal_values_train.jsonl")
    assert len(table) == 8 and all(len(r) == 2 for r in table["rewards"])
    summary = json.loads([line for line in result.stdout.splitlines() if line.startswith('{"split": "train"')][0])
    assert summary["num_prompts"] == 8


def refusal(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `python -m a2po ARGS` prints when it refuses them (in this process: the refusals come before any model
    or data is loaded, so the interpreter's start is all a subprocess would add)."""
    from a2po.cli import main

    with pytest.raises(SystemExit) as refused:
        main(args)
    assert refused.value.code not in (0, None)
    return f"{refused.value.code}\n{capsys.readouterr().err}"


def test_cli_reports_bad_values_clearly(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "beta1 must be > 0" in refusal(["train", "--model", tiny_model_dir, "--beta1", "0", *TINY_RUN], capsys)
    assert "unknown reward 'no_such_reward'" in refusal(
        ["train", "--model", tiny_model_dir, *TINY_RUN, "--reward", "no_such_reward"], capsys)


def test_run_spec_renders_the_equivalent_command():
    spec = RunSpec.from_dict({"name": "demo", "action": "train", "model": "m",
                              "dataset": {"source": "arithmetic", "num_prompts": 8, "eval_size": 4},
                              "rewards": [{"name": "exact_match", "weight": 1.0}],
                              "config": {"beta2": 0.002, "max_steps": 3}})
    from a2po.cli import parse, spec_from_args

    command, script, _, fields = parse(spec.to_cli_args())
    again = spec_from_args(command, script, fields)
    assert again.config == {"beta2": 0.002, "max_steps": 3}
    assert again.dataset["num_prompts"] == 8 and again.model == "m" and again.rewards == spec.rewards
    assert spec.command().startswith("python -m a2po train --model m")


def test_two_processes_each_estimate_their_shard_and_all_see_all_values(tmp_path, tiny_model_dir):
    script = Path(__file__).resolve().parents[1] / "distributed_script.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # With no GPU, `--multi_gpu` starts two torchrun processes that talk over gloo on the CPU (`--cpu` alone would
    # start one process unless MPI is installed).
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                             "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                             str(script), tiny_model_dir, str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0]["prompt_ids"] == reports[1]["prompt_ids"] and len(reports[0]["prompt_ids"]) == 10
    assert reports[0]["v_star"] == reports[1]["v_star"]
    # Each rank sampled only its own half of the prompts, and the callbacks of each saw all of them.
    assert sorted(r["sampled_here"] for r in reports) == [5, 5]
    assert [r["seen_by_callbacks"] for r in reports] == [10, 10]
    assert all(r["global_step"] == 2 for r in reports)


def test_the_bare_command_is_the_dashboards_default_run():
    """`python -m a2po train` with no flags, the launch form as it opens and an empty API spec are one run."""
    from a2po.cli import parse, spec_from_args
    from a2po.runspec import preset_spec

    command, script, _, fields = parse(["train"])
    bare = spec_from_args(command, script, fields).to_dict()
    preset = preset_spec()
    assert {k: bare[k] for k in ("action", "model", "dataset", "rewards", "config", "peft")} == {
        k: preset[k] for k in ("action", "model", "dataset", "rewards", "config", "peft")}
    command, script, _, fields = parse(["train", "--difficulty", "1", "--max_steps", "5", "--preset", "quick-look"])
    changed = spec_from_args(command, script, fields)
    assert changed.dataset["difficulty"] == 1 and changed.dataset["num_prompts"] == 64
    assert changed.config["max_steps"] == 5 and changed.config["learning_rate"] == preset["config"]["learning_rate"]
    assert changed.action == "train"  # the command decides, not the preset


def test_system_prompt_flag_round_trips_and_none_is_kept_none():
    from a2po.cli import parse, spec_from_args

    command, script, _, fields = parse(["train", "--system_prompt", "Be brief.", "--max_steps", "2"])
    spec = spec_from_args(command, script, fields)
    assert spec.dataset["system_prompt"] == "Be brief."
    train, held_out = spec.build_datasets()
    assert train[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert held_out[0]["prompt"][0]["content"] == "Be brief."
    for system_prompt in ("", "Be brief.", None):
        dataset = {"source": "arithmetic", "num_prompts": 8, "eval_size": 4, "system_prompt": system_prompt}
        original = RunSpec.from_dict({"name": "demo", "model": "m", "dataset": dataset, "config": {"max_steps": 3}})
        command, script, _, fields = parse(original.to_cli_args())
        again = spec_from_args(command, script, fields)
        assert again.dataset.get("system_prompt") == system_prompt


def test_cli_refuses_seeds_out_of_range_before_loading_anything(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for flag, value in (("--seed", "-1"), ("--seed", str(2**40)), ("--dataset_seed", "-1")):
        said = refusal(["train", "--model", tiny_model_dir, *TINY_RUN, flag, value], capsys)
        assert "seed must be a whole number from 0 to 4294967295" in said, said[-2000:]
        assert "Stage 1" not in said  # refused where it entered, not after the model loaded
    assert not any(tmp_path.iterdir())  # nothing written


RESUME_RUN = ["--dataset", "arithmetic", "--num_prompts", "16", "--eval_size", "0", "--reward", "exact_match",
              "--num_value_samples", "2", "--max_completion_length", "4", "--per_device_train_batch_size", "4",
              "--use_cpu", "true", "--disable_tqdm", "true", "--filter_all_incorrect", "false", "--logging_steps", "1",
              "--save_steps", "2"]


def test_cli_resume_from_checkpoint_continues_the_run_as_trl_does(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    first = run(["train", "--model", tiny_model_dir, "--output_dir", str(out), *RESUME_RUN, "--max_steps", "4"],
                tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = out / "checkpoint-4"
    first_history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    stamp = (checkpoint / "model.safetensors").stat().st_mtime_ns

    resumed = run(["train", "--model", tiny_model_dir, "--output_dir", str(out), *RESUME_RUN, "--max_steps", "6",
                   "--resume_from_checkpoint", str(checkpoint)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = [line for line in (resumed.stdout + resumed.stderr).splitlines()
              if "'loss'" in line and "train_runtime" not in line]
    assert len(logged) == 2  # steps 5 and 6 only
    history = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["log_history"]
    steps = [h["step"] for h in history if "loss" in h]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [h for h in history if h["step"] <= 4] == [h for h in first_history if h["step"] <= 4]
    assert (checkpoint / "model.safetensors").stat().st_mtime_ns == stamp  # the checkpoint resumed from is kept

    # `true`, as `trainer.train(resume_from_checkpoint=True)`: the newest complete checkpoint of the output folder.
    from a2po.cli import resume_checkpoint

    (out / "checkpoint-8").mkdir()  # cut short before its trainer_state.json: not complete
    assert resume_checkpoint("train", "true", str(out)) == str(out / "checkpoint-6")
    assert resume_checkpoint("train", "True", str(out)) == str(out / "checkpoint-6")
    assert resume_checkpoint("train", None, str(out)) is None


def test_cli_refuses_a_checkpoint_it_cannot_resume_before_writing_anything(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    result = run(["train", "--model", tiny_model_dir, "--output_dir", str(out), *RESUME_RUN, "--max_steps", "2",
                  "--resume_from_checkpoint", str(tmp_path / "missing" / "checkpoint-4")], tmp_path)
    assert result.returncode != 0
    assert "--resume_from_checkpoint" in result.stderr and "no such folder" in result.stderr, result.stderr[-2000:]
    assert not out.exists() and "Stage 1" not in result.stderr
    from a2po.cli import resume_checkpoint

    (tmp_path / "half").mkdir()
    for command, value, folder, message in [("train", str(tmp_path / "half"), out, "not a complete checkpoint"),
                                            ("train", "true", tmp_path / "empty", "no complete checkpoint"),
                                            ("evaluate", str(tmp_path / "half"), out, "applies to `train`")]:
        with pytest.raises(SystemExit, match=message):
            resume_checkpoint(command, value, str(folder))
    assert not out.exists()


GRPO_RUN = ["--method", "grpo", "--dataset", "arithmetic", "--num_prompts", "8", "--eval_size", "4", "--reward",
            "exact_match", "--num_generations", "4", "--max_completion_length", "4",
            "--per_device_train_batch_size", "8", "--max_steps", "2", "--use_cpu", "true", "--save_strategy", "no",
            "--beta", "0.04", "--loss_type", "grpo"]


def test_cli_trains_grpo_and_refuses_its_values_action(tmp_path, tiny_model_dir):
    out = tmp_path / "grpo"
    result = run(["train", "--model", tiny_model_dir, "--output_dir", str(out), *GRPO_RUN], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "model.safetensors").exists() and "Stage 1" not in result.stderr
    final = json.loads([line for line in result.stdout.splitlines() if line.startswith('{"eval_accuracy"')][-1])
    assert 0.0 <= final["eval_accuracy"] <= 1.0 and "eval_loss" not in final
    saved = torch.load(out / "training_args.bin", weights_only=False)
    assert type(saved).__name__ == "GRPOConfig" and (saved.num_generations, saved.beta) == (4, 0.04)
    result = run(["values", "--model", tiny_model_dir, *GRPO_RUN], tmp_path)
    assert result.returncode != 0 and "GRPO has no stage 1" in result.stderr


def test_run_spec_method_grpo_validates_and_round_trips():
    from a2po.cli import parse, spec_from_args
    from a2po.config import GRPOConfig
    from a2po.runspec import with_defaults

    given = {"name": "g", "method": "grpo", "model": "m", "dataset": {"source": "arithmetic", "num_prompts": 8,
                                                                      "eval_size": 4},
             "config": {"num_generations": 4, "beta": 0.04, "max_steps": 3, "per_device_train_batch_size": 8}}
    spec = RunSpec.from_dict(given)
    assert spec.method == "grpo" and spec.to_dict()["method"] == "grpo"
    assert RunSpec.from_dict(spec.to_dict()) == spec
    config = spec.build_config("/tmp/grpo-spec")
    assert isinstance(config, GRPOConfig) and config.prompts_per_step == 2
    command, script, _, fields = parse(spec.to_cli_args())
    again = spec_from_args(command, script, fields)
    assert again.method == "grpo" and again.config == spec.config and again.dataset == spec.dataset
    assert spec.command().startswith("python -m a2po train --model m --run_name g --method grpo")

    # A*-PO specs stay as they were stored (no `method` key); a preset gives GRPO only the settings it has.
    a2po = RunSpec.from_dict({k: v for k, v in given.items() if k not in ("method", "config")})
    assert "method" not in a2po.to_dict() and a2po.method == "a2po" and "method" not in a2po.to_config_dict()
    preset = with_defaults({"method": "grpo"})
    assert "num_value_samples" not in preset["config"] and preset["config"]["learning_rate"] == 1e-5
    assert RunSpec.from_dict(preset).config_class is GRPOConfig

    for bad, message in [({"config": {"num_value_samples": 8}}, "num_value_samples is not a GRPOConfig field"),
                         ({"action": "values"}, "GRPO has no stage 1"),
                         ({"method": "ppo"}, "method must be one of"),
                         ({"config": {"num_generations": 3}}, "multiple of num_generations")]:
        with pytest.raises(ValueError, match=message):
            RunSpec.from_dict({**given, **bad})


def test_grpo_yaml_round_trips(tmp_path):
    from a2po.cli import spec_from_config_file

    spec = RunSpec.from_dict({"name": "g", "method": "grpo", "model": "m", "config": {"num_generations": 2,
                                                                                       "loss_type": "dr_grpo",
                                                                                       "scale_rewards": "none"}})
    path = tmp_path / "grpo.yaml"
    path.write_text(spec.to_yaml())
    assert spec.to_yaml().startswith("# GRPO run 'g'")
    loaded = spec_from_config_file(str(path))
    assert loaded.method == "grpo" and loaded.config == spec.config and loaded.dataset == spec.dataset
