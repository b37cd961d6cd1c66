"""How both trainers call reward functions, as TRL's GRPOTrainer does: None for a completion a function does not
apply to (multi-task data, one checker per task), and `trainer_state` (stage 1: the state before training).
Tiny real models; every expected reward and advantage is computed here from the completions' text."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from datasets import Dataset

from a2po import A2POTrainer, GRPOTrainer
from a2po.core import group_advantages
from a2po.values import prompt_id_for
from tests.a2po.test_grpo_trainer import config as grpo_config
from tests.a2po.test_trainer import Recorder, coin, prompts
from tests.a2po.test_trainer import config as a2po_config


def multitask(n: int = 8) -> Dataset:
    """`prompts(n)` with a `task` column: the even sums are task "even", the others task "odd"."""
    return Dataset.from_list([{**row, "task": row["parity"]} for row in prompts(n).to_list()])


def expected_reward(completion, task: str) -> float:
    """What the two checkers give together: a coin on task "even", its opposite on task "odd"."""
    heads = coin([completion])[0]
    return heads if task == "even" else 1.0 - heads


def coin_text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def check_even(completions, task, **kwargs):
    """Task "even"'s checker; None on the other task's rows."""
    return [expected_reward(c, t) if t == "even" else None for c, t in zip(completions, task)]


def check_odd(completions, task, **kwargs):
    """Task "odd"'s checker; None on the other task's rows."""
    return [expected_reward(c, t) if t == "odd" else None for c, t in zip(completions, task)]


def combined(completions, task, **kwargs):
    """Both checkers in one function."""
    return [expected_reward(c, t) for c, t in zip(completions, task)]


def task_of(dataset: Dataset) -> dict[str, str]:
    return {prompt_id_for(row): row["task"] for row in dataset.to_list()}


def train_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


def samples_by_step(recorder: Recorder) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for event in recorder.of("samples"):
        for sample in event["samples"]:
            if sample["split"] == "train":
                out.setdefault(sample["step"], []).append(sample)
    return out


def hand_advantages(rewards: list[float]) -> list[float]:
    """GRPO's advantages of one group by hand, over the scored completions (NaN: unscored, advantage 0)."""
    scored = [r for r in rewards if not math.isnan(r)]
    if len(scored) < 2:
        return [0.0] * len(rewards)
    mean, std = statistics.mean(scored), statistics.stdev(scored)
    return [0.0 if math.isnan(r) else (r - mean) / (std + 1e-4) for r in rewards]


def test_group_advantages_leave_unscored_completions_out():
    nan = math.nan
    # Group 1: 1, -, 0, 1 (mean 2/3, std of 1, 0, 1); group 2: nothing scored; group 3: one scored value (no std).
    rewards = [1.0, nan, 0.0, 1.0, nan, nan, nan, nan, nan, 1.0, nan, nan]
    std = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    advantages, stds = group_advantages(torch.tensor(rewards), 4, "group")
    first = [(1 - 2 / 3) / (std + 1e-4), 0.0, (0 - 2 / 3) / (std + 1e-4), (1 - 2 / 3) / (std + 1e-4)]
    assert advantages.tolist() == pytest.approx(first + [0.0] * 8)
    assert stds[0].item() == pytest.approx(std) and stds[4:].isnan().all()
    none, _ = group_advantages(torch.tensor(rewards), 4, "none")
    assert none.tolist() == pytest.approx([1 / 3, 0.0, -2 / 3, 1 / 3] + [0.0] * 8)
    batch, _ = group_advantages(torch.tensor(rewards), 4, "batch")
    batch_std = statistics.stdev([1.0, 0.0, 1.0, 1.0])
    assert batch.tolist() == pytest.approx([a / (batch_std + 1e-4) for a in (1 / 3, 0.0, -2 / 3, 1 / 3)] + [0.0] * 8)


def test_a2po_multitask_checkers_score_as_one_combined_checker(tmp_path, tiny_model_dir):
    data = multitask(8)
    tasks = task_of(data)
    runs = {}
    for name, funcs in (("split", [check_even, check_odd]), ("combined", [combined])):
        recorder = Recorder()
        trainer = A2POTrainer(tiny_model_dir, funcs, args=a2po_config(tmp_path / name, filter_all_incorrect=False),
                              train_dataset=data, callbacks=[recorder])
        trainer.train()
        runs[name] = trainer, recorder
    split, recorder = runs["split"]
    table = split.value_tables["train"].to_list()
    for row in table:  # stage 1: each reference sample scored by its task's checker
        assert row["rewards"] == [expected_reward(c, tasks[row["prompt_id"]]) for c in row["completions"]]
    assert table == runs["combined"][0].value_tables["train"].to_list()
    for log, step in zip(train_logs(split), sorted(samples_by_step(recorder))):  # stage 2
        samples = samples_by_step(recorder)[step]
        assert [s["reward"] for s in samples] == [expected_reward(s["completion"], tasks[s["prompt_id"]])
                                                  for s in samples]
        for task in ("even", "odd"):  # each checker's metric: the mean over its own task's completions
            mine = [s["reward"] for s in samples if tasks[s["prompt_id"]] == task]
            value = log[f"rewards/check_{task}"]
            assert value == pytest.approx(statistics.mean(mine)) if mine else math.isnan(value)
    keys = ("loss", "reward", "accuracy", "advantage")
    assert [{k: h[k] for k in keys} for h in train_logs(split)] == \
        [{k: h[k] for k in keys} for h in train_logs(runs["combined"][0])]


def test_grpo_multitask_checkers_score_as_one_combined_checker(tmp_path, tiny_model_dir):
    data = multitask(8)
    tasks = task_of(data)
    runs = {}
    for name, funcs in (("split", [check_even, check_odd]), ("combined", [combined])):
        recorder = Recorder()
        trainer = GRPOTrainer(tiny_model_dir, funcs, train_dataset=data, callbacks=[recorder],
                              args=grpo_config(tmp_path / name, per_device_train_batch_size=8, num_generations=4))
        trainer.train()
        runs[name] = trainer, recorder
    split, recorder = runs["split"]
    for samples in samples_by_step(recorder).values():
        rewards = [expected_reward(s["completion"], tasks[s["prompt_id"]]) for s in samples]
        assert [s["reward"] for s in samples] == rewards
        expected = [a for i in range(0, len(rewards), 4) for a in hand_advantages(rewards[i:i + 4])]
        assert [s["advantage"] for s in samples] == pytest.approx(expected, abs=1e-5)
    keys = ("loss", "reward", "reward_std", "accuracy", "frac_reward_zero_std")
    assert [{k: h[k] for k in keys} for h in train_logs(split)] == \
        [{k: h[k] for k in keys} for h in train_logs(runs["combined"][0])]


def test_grpo_a_completion_no_function_scores_gets_nan_a_warning_and_no_advantage(tmp_path, tiny_model_dir):
    """As TRL: reward NaN, a warning naming the prompt and completion (here also the function and the task), left
    out of its group's baseline and of the reward metrics, advantage 0."""
    data = multitask(8)
    tasks = task_of(data)

    def sometimes(completions, task, **kwargs):
        """Task "even"'s checker, which also skips a third of its completions: groups with some unscored."""
        return [None if t == "odd" or sum(map(ord, coin_text(c))) % 3 == 0 else expected_reward(c, t)
                for c, t in zip(completions, task)]

    recorder = Recorder()
    trainer = GRPOTrainer(tiny_model_dir, sometimes, train_dataset=data, callbacks=[recorder],
                          args=grpo_config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=4))
    with pytest.warns(UserWarning, match=r"All reward functions \(sometimes\) returned None \(or NaN\) for \d+ of 8 "
                                         r"completions of task .*'odd'.* \(e\.g\. prompt '\d \+ \d =', completion"):
        trainer.train()
    seen_partial = False
    by_step = samples_by_step(recorder)
    for samples, log in zip([by_step[step] for step in sorted(by_step)], train_logs(trainer)):
        rewards = [math.nan if tasks[s["prompt_id"]] == "odd" or sum(map(ord, coin_text(s["completion"]))) % 3 == 0
                   else expected_reward(s["completion"], "even") for s in samples]
        assert [s["reward"] for s in samples] == pytest.approx(rewards, nan_ok=True)
        expected = [a for i in range(0, len(rewards), 4) for a in hand_advantages(rewards[i:i + 4])]
        assert [s["advantage"] for s in samples] == pytest.approx(expected, abs=1e-5)
        seen_partial |= any(0 < sum(map(math.isnan, rewards[i:i + 4])) < 3 for i in range(0, len(rewards), 4))
        scored = [r for r in rewards if not math.isnan(r)]
        if scored:  # the metrics over the scored completions only
            assert log["reward"] == pytest.approx(statistics.mean(scored))
            assert log["accuracy"] == pytest.approx(statistics.mean(r >= 1 for r in scored))
        else:
            assert math.isnan(log["reward"])
        assert math.isfinite(log["loss"])
    assert seen_partial  # a group with scored and unscored completions was met, so the baseline was tested


def test_a2po_a_completion_no_function_scores_is_an_error_naming_the_functions_and_task(tmp_path, tiny_model_dir):
    """A*-PO has no fallback: V* and r - V* need a number (a 0 would bias V* and the filter)."""
    trainer = A2POTrainer(tiny_model_dir, check_even, args=a2po_config(tmp_path), train_dataset=multitask(4))
    with pytest.raises(ValueError, match=r"All reward functions \(check_even\) returned None \(or NaN\) for 8 of 16 "
                                         r"completions of task 'odd' \(e\.g\. prompt '\d \+ \d =', completion .*\): "
                                         r"A\*-PO needs a number for every completion.*Give each task a reward "
                                         r"function"):
        trainer.train()


@pytest.mark.parametrize("trainer_class, config", [(A2POTrainer, a2po_config), (GRPOTrainer, grpo_config)])
def test_a_function_returning_none_is_an_error_naming_it_and_the_tasks(tmp_path, tiny_model_dir, trainer_class,
                                                                       config):
    def skips_all(completions, **kwargs):
        return None

    args = config(tmp_path, per_device_train_batch_size=8, **({"num_generations": 2} if config is grpo_config else {}))
    trainer = trainer_class(tiny_model_dir, [check_even, skips_all], args=args, train_dataset=multitask(4))
    with pytest.raises(ValueError, match=r"Reward function 'skips_all' returned None for \d+ completions of task "
                                         r"'even', 'odd'; it must return a list with one float per completion"):
        trainer.train()


class Steps(Recorder):
    """Records the step at which stage 1 begins and ends, with the rewards' own records in one sequence."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def on_values_begin(self, args, state, control, **kw):
        self.log.append(("values_begin", state.global_step))

    def on_values_end(self, args, state, control, **kw):
        self.log.append(("values_end", state.global_step))


@pytest.mark.parametrize("method", ["a2po", "grpo"])
def test_rewards_see_the_trainer_state(tmp_path, tiny_model_dir, method):
    """Stage 1 sees the state before training (global_step 0, even for an eval set's V* estimated at step 2);
    training the step being taken from (0, then 1), evaluation the step evaluated."""
    log: list = []

    def curriculum(completions, split, trainer_state, **kwargs):
        log.append((split[0], trainer_state.global_step))
        return [1.0] * len(completions)

    def marked(n: int, split: str) -> Dataset:
        return Dataset.from_list([{**row, "prompt": f"{split} {row['prompt']}", "split": split}
                                  for row in prompts(n, chat=False).to_list()])

    common = dict(eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4)
    if method == "a2po":
        args = a2po_config(tmp_path, filter_all_incorrect=False, **common)
        trainer = A2POTrainer(tiny_model_dir, curriculum, args=args, train_dataset=marked(8, "train"),
                              eval_dataset=marked(4, "eval"), callbacks=[Steps(log)])
    else:
        args = grpo_config(tmp_path, **common)
        trainer = GRPOTrainer(tiny_model_dir, curriculum, args=args, train_dataset=marked(8, "train"),
                              eval_dataset=marked(4, "eval"))
    trainer.train()
    stage_one, outside, inside = [], [], False
    for event in log:
        if event[0] in ("values_begin", "values_end"):
            inside = event[0] == "values_begin"
        (stage_one if inside else outside).append(event)
    begins = [e for e in stage_one if e[0] == "values_begin"]
    if method == "a2po":
        # The train set's V* before training, the eval set's at the first evaluation (step 2): rewards see 0 both.
        assert begins == [("values_begin", 0), ("values_begin", 2)]
        assert set(stage_one) - set(begins) == {("train", 0), ("eval", 0)}
    else:
        assert stage_one == []
    assert sorted({e for e in outside if e[0] == "train"}) == [("train", 0), ("train", 1)]
    assert {e for e in outside if e[0] == "eval"} == {("eval", 2)}
