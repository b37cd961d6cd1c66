"""Reward functions the operator registers (`a2po.reward_registry`): a file, an installed entry point, a dotted
path. Read without importing, named by specs, recorded by their source's hash, loaded only where they score, and
checked as the built-in ones are. The CLI (`--reward-module`, a dotted `--reward`) in real subprocesses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from datasets import Dataset

from a2po.reward_registry import (
    MODULES_ENV,
    RewardRegistryError,
    get_reward_function,
    read_registry,
    register_modules,
    reward_changes,
    stamp_sources,
)
from a2po.runspec import RunSpec, SpecError

ROOT = Path(__file__).resolve().parents[2]

REWARDS = '''
"""Rewards of the tests; importing this file appends the importing process's pid to $MARKER."""
import os

with open(os.environ["MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")


def my_check(completions, ground_truth, **kwargs):
    """1.0 where the completion is the answer, else 0.0.

    More lines that the picker does not show.
    """
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.strip() == str(g).strip()) for t, g in zip(texts, ground_truth)]


def normalize(text):
    return text.strip()


def _private(completions, **kwargs):
    return [0.0] * len(completions)
'''

BROKEN = '''
import os

with open(os.environ["MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")


def raises(completions, **kwargs):
    """Divides by zero."""
    return 1 / 0


def returns_none(completions, **kwargs):
    return None


def too_few(completions, **kwargs):
    return [1.0]


def half(completions, **kwargs):
    return [0.5] * len(completions)
'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def marker_pids(marker: Path) -> list[int]:
    return [int(line) for line in marker.read_text().split()] if marker.exists() else []


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "imported-by.txt"
    monkeypatch.setenv("MARKER", str(path))
    return path


def entry_point_package(folder: Path, *, name: str = "ep_rewards", entry: str = "ep_check") -> Path:
    """A package on `folder` (put it on sys.path / PYTHONPATH) whose `.dist-info` declares an `a2po.rewards` entry
    point `entry` = `<name>.checks:check`; both its `__init__` and its module record their importers in $MARKER."""
    record = 'import os\nwith open(os.environ["MARKER"], "a") as m:\n    m.write(f"{os.getpid()}\\n")\n'
    write(folder / name / "__init__.py", record)
    write(folder / name / "checks.py", record + textwrap.dedent('''
        def check(completions, ground_truth, **kwargs):
            """1.0 where the completion ends with the answer."""
            texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
            return [float(t.strip().endswith(str(g).strip())) for t, g in zip(texts, ground_truth)]
        '''))
    dist = folder / f"{name}-0.1.dist-info"
    write(dist / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    write(dist / "entry_points.txt", f"[a2po.rewards]\n{entry} = {name}.checks:check\n")
    return folder


def test_a_file_is_read_without_importing_it(tmp_path, marker):
    path = write(tmp_path / "my_rewards.py", REWARDS)
    registry = read_registry([str(path)], entry_points=False)
    assert registry.names() == ["my_check"] and not registry.problems  # no helper, nothing private
    reward = registry.rewards["my_check"]
    assert reward.doc == "1.0 where the completion is the answer, else 0.0."
    assert reward.params == ("completions", "ground_truth")
    assert reward.file == str(path.resolve()) and reward.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert not marker.exists()  # parsed, never executed

    from a2po.reward_registry import load_reward

    loaded = load_reward("my_check", registry)
    assert loaded.__name__ == "my_check" and loaded(completions=["3", "4"], ground_truth=["3", "5"]) == [1.0, 0.0]
    assert marker_pids(marker) == [os.getpid()]  # imported once it scores


def test_bad_reward_files_are_clear_errors(tmp_path):
    with pytest.raises(RewardRegistryError, match=r"no such file"):
        register_modules([str(tmp_path / "missing.py")], environ={})
    with pytest.raises(RewardRegistryError, match=r"a \.py file"):
        register_modules([str(write(tmp_path / "notes.txt", "x"))], environ={})
    with pytest.raises(RewardRegistryError, match=r"bad\.py is not valid Python \(line 1\)"):
        register_modules([str(write(tmp_path / "bad.py", "def check(:\n"))], environ={})
    with pytest.raises(RewardRegistryError, match="defines no reward function"):
        register_modules([str(write(tmp_path / "helpers.py", "def strip(text):\n    return text\n"))], environ={})
    with pytest.raises(RewardRegistryError, match="lists 'gone'"):
        register_modules([str(write(tmp_path / "listed.py", "__all__ = ['gone']\n"))], environ={})
    with pytest.raises(RewardRegistryError, match="named like the built-in reward 'exact_match'"):
        register_modules([str(write(tmp_path / "clash.py", "def exact_match(completions, **kw):\n    return []\n"))],
                         environ={})
    first = write(tmp_path / "a" / "same.py", "def check(completions, **kw):\n    return []\n")
    second = write(tmp_path / "b" / "same.py", "def check(completions, **kw):\n    return []\n")
    environ: dict[str, str] = {}
    register_modules([str(first)], environ=environ)
    with pytest.raises(RewardRegistryError, match="Two rewards are named 'check'"):
        register_modules([str(second)], environ=environ)
    assert environ[MODULES_ENV] == str(first.resolve())  # the refused file is not registered


def test_all_picks_the_rewards_of_a_file(tmp_path):
    path = write(tmp_path / "picked.py", """
        __all__ = ["second"]

        def first(completions, **kwargs):
            return [0.0] * len(completions)

        def second(completions, **kwargs):
            '''The one registered.'''
            return [1.0] * len(completions)
        """)
    assert read_registry([str(path)], entry_points=False).names() == ["second"]


def test_an_entry_point_is_located_without_executing_its_package(tmp_path, marker, monkeypatch):
    monkeypatch.syspath_prepend(str(entry_point_package(tmp_path / "site")))
    registry = read_registry([])
    reward = registry.rewards["ep_check"]
    assert reward.origin == "entry point" and reward.module == "ep_rewards.checks" and reward.function == "check"
    assert reward.file == str((tmp_path / "site" / "ep_rewards" / "checks.py").resolve())
    assert reward.doc == "1.0 where the completion ends with the answer." and reward.params[1] == "ground_truth"
    assert not marker.exists() and "ep_rewards" not in sys.modules  # neither the package nor its module ran
    assert get_reward_function("ep_check")(completions=["= 4"], ground_truth=["4"]) == [1.0]
    assert len(marker_pids(marker)) == 2  # the package's __init__, then its module: only now


def test_a_dotted_path_is_registered_under_its_path(tmp_path, marker, monkeypatch):
    monkeypatch.syspath_prepend(str(entry_point_package(tmp_path / "site", name="dotted_lib", entry="unused")))
    environ: dict[str, str] = {}
    added = register_modules(["dotted_lib.checks.check"], environ=environ)
    assert [r.name for r in added] == ["dotted_lib.checks.check"] and not marker.exists()
    with pytest.raises(RewardRegistryError, match="defines no 'nothing'"):
        register_modules(["dotted_lib.checks.nothing"], environ={})
    with pytest.raises(RewardRegistryError, match="No module named 'nowhere'"):
        register_modules(["nowhere.checks.check"], environ={})


def test_specs_name_registered_rewards_and_refuse_others_with_the_registered_names(tmp_path, marker, monkeypatch):
    path = write(tmp_path / "my_rewards.py", REWARDS)
    monkeypatch.setenv(MODULES_ENV, str(path))
    spec = RunSpec.from_dict({"rewards": [{"name": "my_check", "weight": 1}]})
    assert spec.rewards == [{"name": "my_check", "weight": 1.0}]
    with pytest.raises(SpecError, match=r"unknown reward 'nope'; known: exact_match, math_equivalence, "
                                        r"task_checker; registered: my_check"):
        RunSpec.from_dict({"rewards": [{"name": "nope"}]})
    with pytest.raises(ValueError, match="registered: my_check"):
        get_reward_function("nope")
    assert not marker.exists()

    stamped, warned = stamp_sources(spec.rewards)
    source = stamped[0]["source"]
    assert source == {"origin": "file", "file": str(path.resolve()), "function": "my_check",
                      "sha256": hashlib.sha256(path.read_bytes()).hexdigest()} and warned == []
    recorded = RunSpec.from_dict({"rewards": stamped})
    assert "--reward_module" in recorded.to_cli_args() and str(path.resolve()) in recorded.command()
    assert recorded.value_fingerprint() != spec.value_fingerprint()  # V* is a function of the source

    path.write_text(path.read_text() + "\n# edited\n")
    changes = reward_changes(stamped)
    assert len(changes) == 1 and "Reward my_check changed since it was recorded" in changes[0]
    again, warned = stamp_sources(stamped, what="the clone")
    assert "the clone scores with the current version" in warned[0]
    assert again[0]["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    path.unlink()
    assert "no longer registered" in reward_changes(stamped)[0]


def rows(n: int = 2) -> Dataset:
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i} + {i} ="}], "ground_truth": str(2 * i)}
                              for i in range(n)])


@pytest.mark.parametrize("name, message", [
    ("raises", r"Reward function 'raises' raised .*ZeroDivisionError: division by zero \(in raises, `raises` in "),
    ("returns_none", r"'returns_none' .*returned None \(in returns_none, `returns_none` in "),
    ("too_few", r"'too_few' .*returned 1 values for 4 completions \(in too_few, `too_few` in "),
])
def test_a_broken_registered_reward_is_named_with_its_file(tmp_path, marker, monkeypatch, tiny_model_dir, name,
                                                           message):
    from a2po import A2POConfig, A2POTrainer

    path = write(tmp_path / "broken_rewards.py", BROKEN)
    monkeypatch.setenv(MODULES_ENV, str(path))
    args = A2POConfig(output_dir=str(tmp_path / "out"), num_value_samples=2, max_completion_length=4, use_cpu=True,
                      report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=get_reward_function(name), args=args,
                          train_dataset=rows())
    with pytest.raises((ValueError, RuntimeError), match=message + str(path.resolve()).replace(".", r"\.")):
        trainer.estimate_optimal_values()


def test_non_binary_registered_rewards_warn_once(tmp_path, marker, monkeypatch, tiny_model_dir):
    from a2po import A2POConfig, A2POTrainer

    monkeypatch.setenv(MODULES_ENV, str(write(tmp_path / "broken_rewards.py", BROKEN)))
    args = A2POConfig(output_dir=str(tmp_path / "out"), num_value_samples=2, max_completion_length=4, use_cpu=True,
                      report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=[get_reward_function("half")], args=args,
                          train_dataset=rows())
    assert trainer.reward_names == ["half"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.estimate_optimal_values()
    assert sum("binary" in str(w.message) for w in caught) == 1


# ------------------------------------------------------------------------------------------------- the CLI

TINY_RUN = ["--dataset", "arithmetic", "--num_prompts", "4", "--eval_size", "2", "--num_value_samples", "2",
            "--max_completion_length", "4", "--per_device_train_batch_size", "2", "--max_steps", "1",
            "--use_cpu", "true", "--save_strategy", "no", "--filter_all_incorrect", "false", "--logging_steps", "1"]


def cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    # PYTHONPATH: this tree's package first, wherever the environment's editable install points.
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), *([env.pop("PYTHONPATH")] if "PYTHONPATH" in env else [])]),
               **env}
    environ.pop(MODULES_ENV, None)
    proc = subprocess.Popen([sys.executable, "-m", "a2po", *args], cwd=cwd, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=600)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.pid = proc.pid
    return result


@pytest.mark.slow
def test_cli_trains_with_a_reward_module_file(tmp_path, tiny_model_dir, marker):
    path = write(tmp_path / "my_rewards.py", REWARDS)
    result = cli(["train", "--model", tiny_model_dir, "--reward-module", str(path), "--reward", "my_check",
                  "--output_dir", str(tmp_path / "out"), *TINY_RUN], tmp_path, MARKER=str(marker))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'rewards/my_check'" in result.stdout + result.stderr
    assert marker_pids(marker) == [result.pid]  # scored in the CLI's own process
    assert (tmp_path / "out" / "model.safetensors").exists()

    result = cli(["train", "--model", tiny_model_dir, "--reward_module", str(tmp_path / "nope.py"), *TINY_RUN],
                 tmp_path, MARKER=str(marker))
    assert result.returncode != 0 and "--reward-module / --reward:" in result.stderr and "no such file" in result.stderr


@pytest.mark.slow
def test_cli_trains_with_a_dotted_reward_path(tmp_path, tiny_model_dir, marker):
    site = entry_point_package(tmp_path / "site", name="my_lib", entry="unused")
    result = cli(["train", "--model", tiny_model_dir, "--reward", "my_lib.checks.check",
                  "--output_dir", str(tmp_path / "out"), *TINY_RUN], tmp_path, MARKER=str(marker),
                 PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'rewards/my_lib.checks.check'" in result.stdout + result.stderr
    assert set(marker_pids(marker)) == {result.pid}
    result = cli(["train", "--model", tiny_model_dir, "--reward", "my_lib.checks.missing", *TINY_RUN], tmp_path,
                 MARKER=str(marker), PYTHONPATH=str(site))
    assert result.returncode != 0 and "defines no 'missing'" in result.stderr


TASK_REWARDS = '''
import os

with open(os.environ["MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")


def check_even(completions, task, trainer_state, **kwargs):
    """1.0 on task "even" before training (a curriculum reward: `trainer_state` is required); None elsewhere."""
    return [float(trainer_state.global_step == 0) if t == "even" else None for t in task]


def check_odd(completions, task, **kwargs):
    """0.5 on task "odd"; None elsewhere."""
    return [0.5 if t == "odd" else None for t in task]
'''


def test_multitask_rewards_that_read_trainer_state_score_outside_the_trainer(tmp_path, marker, monkeypatch):
    """"Try the reward" and the playground call rewards as stage 1 does: `trainer_state` (before training), None
    skipped in the weighted sum; a completion no function scores is named with its task in "Try the reward"."""
    from app.runtime.playground.process import score_rows, weighted_rewards
    from app.web.forms import reward_columns

    monkeypatch.setenv(MODULES_ENV, str(write(tmp_path / "task_rewards.py", TASK_REWARDS)))
    assert reward_columns("check_even") == ["task"]  # not a dataset column the form would ask for
    rows = [{"prompt": "1 + 1 =", "task": "even"}, {"prompt": [{"role": "user", "content": "1 + 2 ="}], "task": "odd"}]
    both = [{"name": "check_even", "weight": 1.0}, {"name": "check_odd", "weight": 2.0}]
    assert score_rows(both, rows, ["2", "3"]) == [1.0, 1.0]  # 1 * 1.0 on the first row, 2 * 0.5 on the second
    only_even = [{"name": "check_even", "weight": 1.0}]
    assert weighted_rewards(only_even, rows, ["2", "3"]) == [1.0, None]
    assert get_reward_function("check_odd")(completions=["2", "3"], task=["even", "odd"]) == [None, 0.5]
    with pytest.raises(ValueError, match=r"All reward functions \(check_even\) returned None for 1 of 2 completions "
                                         r"of task 'odd': no reward scores them"):
        score_rows(only_even, rows, ["2", "3"])
