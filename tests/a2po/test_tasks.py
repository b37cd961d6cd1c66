"""reasoning-gym tasks: generation, binary scoring by each task's checker, held-out disjointness, mixes, settings
validation, the run spec and CLI, and a training step of a tiny model through the library and the CLI."""

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from decimal import Decimal

import pytest
import reasoning_gym as rg  # a dev dependency: when missing, these tests fail rather than skip
from datasets import Dataset

from a2po import A2POConfig, A2POTrainer
from a2po.cli import main, parse, spec_from_args
from a2po.data import mixed_task_dataset, preview_tasks, task_dataset
from a2po.reward_registry import get_reward_function
from a2po.runspec import RunSpec
from a2po.tasks import (
    ANSWER_INSTRUCTION,
    INSTALL_HINT,
    NUMBER_INSTRUCTION,
    SEED_BLOCK,
    TASKS,
    _take,
    datasets_from_spec,
    extract_answer,
    normalize_settings,
    reward_problems,
    score_answer,
    settings_schema,
    validate_task_spec,
)

LISTED = ["basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "countdown"]
FEW_PROMPTS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # chain_sum: 200 distinct prompts
task_checker = get_reward_function("task_checker")


def tagged(answer):
    return [{"role": "assistant", "content": f"Let me think. <answer>{answer}</answer>"}]


def partial_answer(row):
    """An answer the task's own checker gives partial credit (0 < score < 1)."""
    entry = json.loads(row["task_entry"])
    if row["task"] == "countdown":  # right numbers, wrong value: 0.05
        numbers = [str(n) for n in entry["metadata"]["numbers"]]
        total = sum(entry["metadata"]["numbers"])
        return ("+" if total != entry["metadata"]["target"] else "-").join(numbers)
    if row["task"] == "gsm_symbolic":  # a wrong number: 0.01
        return str(Decimal(row["ground_truth"]) + 1)
    return f"{row['ground_truth']} in total"  # the answer inside more text: len(answer) / len(text)


def checker_score(row, answer):
    """reasoning-gym's own score, not made binary."""
    dataset = rg.create_dataset(row["task"], seed=0, size=1, **json.loads(row["task_settings"]))
    return dataset.score_answer(answer, json.loads(row["task_entry"]))


def test_registry_matches_the_installed_reasoning_gym_configs():
    for name, task in TASKS.items():
        config = {f.name: f for f in dataclasses.fields(rg.factory.DATASETS[name][1])}
        for setting in task.settings:
            assert setting.name in config, (name, setting.name)
            default = config[setting.name].default
            if (name, setting.name) != ("basic_arithmetic", "operators"):  # ours leaves '/' out (slow, floored)
                assert setting.default == (tuple(default) if setting.kind == "subset" else default), setting
            if setting.kind == "int":
                assert setting.low <= setting.default <= setting.high, setting
        assert [s["name"] for s in settings_schema(name)] == [s.name for s in task.settings]
    assert set(LISTED) <= set(TASKS)
    assert settings_schema("countdown")[0]["allowed"] == "an integer in 2..10"


@pytest.mark.parametrize("name", LISTED)
def test_each_task_generates_reproducibly_and_scores_binary(name):
    train, held_out = task_dataset(name, 3, seed=5, eval_size=2)
    assert train.to_list() == task_dataset(name, 3, seed=5, eval_size=2)[0].to_list()
    assert train.to_list() != task_dataset(name, 3, seed=6)[0].to_list()
    assert len(train) == 3 and len(held_out) == 2
    assert train.column_names == ["prompt", "ground_truth", "task", "task_entry", "task_settings", "answer_format"]
    rows = train.to_list()
    for row in rows:
        assert row["task"] == name and row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
        assert row["prompt"][0]["content"].endswith(ANSWER_INSTRUCTION)
        assert json.loads(row["task_entry"])["answer"] == row["ground_truth"]
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    prompts = [row["prompt"] for row in rows]
    right = [tagged(row["ground_truth"]) for row in rows]
    assert task_checker(prompts=prompts, completions=right, **columns) == [1.0] * 3
    partial = [partial_answer(row) for row in rows]
    assert all(0 < checker_score(row, answer) < 1 for row, answer in zip(rows, partial))
    assert task_checker(prompts=prompts, completions=[tagged(a) for a in partial], **columns) == [0.0] * 3
    untagged = [row["ground_truth"] for row in rows]  # right, but not where the prompt asked for it
    assert task_checker(prompts=prompts, completions=untagged, **columns) == [0.0] * 3


def test_answer_extraction_takes_the_last_complete_tag():
    assert extract_answer("<answer>1</answer> no, <answer> 2 </answer>") == "2"
    assert extract_answer("<answer>1 <answer>2</answer>") == "2"
    assert extract_answer("<answer>1</answer> then <answer>2") == "1"  # an unclosed tag is no answer
    assert extract_answer("<answer>\n12\n</answer>") == "12"
    assert extract_answer("The answer is 12.") is None
    assert extract_answer([{"role": "assistant", "content": "<answer>7</answer>"}]) == "7"
    row = task_dataset("chain_sum", 1, seed=1)[0][0]
    assert score_answer("chain_sum", row["task_entry"], None) == 0.0
    wrong_then_right = f"<answer>{int(row['ground_truth']) + 1}</answer> <answer>{row['ground_truth']}</answer>"
    assert task_checker(completions=[wrong_then_right], task=["chain_sum"], task_entry=[row["task_entry"]]) == [1.0]


def test_countdown_never_hands_code_to_its_checker(monkeypatch):
    row = task_dataset("countdown", 1, seed=2)[0][0]
    assert score_answer("countdown", row["task_entry"], row["ground_truth"]) == 1.0

    def refuse(*args):
        raise AssertionError("the checker must not see this answer")

    monkeypatch.setattr("a2po.tasks._score_function", refuse)
    for answer in ("__import__('os').getcwd()", "9**9**9**9", "x = 3"):
        assert score_answer("countdown", row["task_entry"], answer) == 0.0


def test_rows_survive_arrow_and_json_round_trips():
    train, _ = mixed_task_dataset([{"task": t} for t in LISTED], 10, seed=4)
    rows = train.to_list()
    again = json.loads(json.dumps(Dataset.from_list(rows).to_list()))
    assert again == rows
    scores = task_checker(completions=[tagged(r["ground_truth"]) for r in again], task=[r["task"] for r in again],
                          task_entry=[r["task_entry"] for r in again],
                          task_settings=[r["task_settings"] for r in again])
    assert scores == [1.0] * 10


def test_held_out_prompts_never_repeat_training_prompts():
    settings = FEW_PROMPTS  # the held-out seeds often draw training prompts
    train, held_out = task_dataset("chain_sum", 100, seed=0, settings=settings, eval_size=40)
    train_texts = {r["prompt"][0]["content"] for r in train}
    eval_texts = [r["prompt"][0]["content"] for r in held_out]
    assert len(held_out) == 40 and not train_texts & set(eval_texts)
    raw = _take("chain_sum", normalize_settings("chain_sum", settings), SEED_BLOCK, 40)  # before the filter
    assert train_texts & {r["prompt"][0]["content"] for r in raw}, "the replacement path was not exercised"
    assert held_out.to_list() == task_dataset("chain_sum", 100, seed=0, settings=settings, eval_size=40)[1].to_list()
    with pytest.raises(ValueError, match="unlike every training prompt.*Widen them"):
        task_dataset("chain_sum", 1000, seed=0, settings=settings, eval_size=40)
    assert task_dataset("chain_sum", 5, seed=0, eval_size=0)[1] is None


def test_a_mix_follows_the_weights_and_keeps_each_rows_task():
    tasks = [{"task": "chain_sum", "weight": 2, "settings": {"max_terms": 2}}, {"task": "leg_counting", "weight": 1},
             {"task": "basic_arithmetic", "weight": 1}]
    train, held_out = mixed_task_dataset(tasks, 10, seed=3, eval_size=4)
    assert Counter(train["task"]) == {"chain_sum": 5, "leg_counting": 3, "basic_arithmetic": 2}
    assert Counter(held_out["task"]) == {"chain_sum": 2, "leg_counting": 1, "basic_arithmetic": 1}
    assert train["task"] != sorted(train["task"], key=[t["task"] for t in tasks].index)  # shuffled together
    assert train.to_list() == mixed_task_dataset(tasks, 10, seed=3, eval_size=4)[0].to_list()
    for row in train.to_list():
        if row["task"] == "chain_sum":
            assert json.loads(row["task_entry"])["metadata"]["num_terms"] == 2
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in held_out}


def test_settings_are_validated_with_the_setting_and_its_range():
    assert normalize_settings("basic_arithmetic", {"operators": "+-", "max_terms": 3.0})["operators"] == ["+", "-"]
    assert normalize_settings("chain_sum", None)["max_terms"] == 6  # defaults filled in
    cases = {
        ("chain_sum", "max_terms", 13): "settings.max_terms must be an integer in 2..12 (got 13)",
        ("chain_sum", "min_terms", 5): "settings.min_terms (5) must be <= max_terms (4)",
        ("chain_sum", "allow_negation", "yes"): "settings.allow_negation must be true or false",
        ("chain_sum", "seed", 1): "set it at the dataset level",
        ("chain_sum", "terms", 3): "chain_sum's settings are ['min_terms', 'max_terms'",
        ("basic_arithmetic", "operators", "+%"): "must be a non-empty list drawn from ['+', '-', '*', '/']",
        ("basic_arithmetic", "whitespace", "none"): "one of ['no_space', 'single', 'random']",
        ("basic_arithmetic", "operators", "+/"): "needs (max_terms - 1) * max_digits <= 12 (got (6 - 1) * 4)",
        ("leg_counting", "max_animals", 38): "settings.max_animals must be an integer in 1..37",
        ("gsm_symbolic", "difficulty", 1.0): "gsm_symbolic has no settings",
    }
    for (task, name, value), message in cases.items():
        settings = {name: value, "max_terms": 4} if name == "min_terms" else {name: value}
        with pytest.raises(ValueError) as error:
            task_dataset(task, 2, settings=settings)
        assert message in str(error.value)
    assert normalize_settings("basic_arithmetic", {"operators": "+/", "max_terms": 4, "max_digits": 4})
    with pytest.raises(ValueError, match="Unknown reasoning-gym task 'sudoku'; supported: basic_arithmetic"):
        task_dataset("sudoku", 2)


def test_dataset_specs_are_checked_field_by_field():
    ok = {"source": "reasoning-gym", "task": "chain_sum", "num_prompts": 4, "eval_size": 0, "seed": 0}
    assert validate_task_spec(ok) == []
    assert validate_task_spec({"source": "reasoning-gym", "tasks": [{"task": "countdown", "weight": 0.5}]}) == []
    problems = validate_task_spec({**ok, "tasks": [{"task": "chain_sum"}], "num_prompts": 100_001, "eval_size": -1,
                                   "seed": -2, "difficulty": 1})
    assert problems == [
        "dataset has keys ['difficulty'] that a reasoning-gym source does not use; use ['answer_format', "
        "'eval_size', 'num_prompts', 'seed', 'settings', 'source', 'system_prompt', 'task', 'tasks']",
        "give dataset.task (one of ['basic_arithmetic', 'chain_sum', 'leg_counting', 'gsm_symbolic', 'countdown']) "
        "or dataset.tasks (a weighted mix), not both",
        "dataset.num_prompts must be an integer in 1..100000 (got 100001)",
        "dataset.eval_size must be an integer in 0..100000 (got -1)", "dataset.seed must be an integer >= 0 (got -2)"]
    problems = validate_task_spec({"source": "reasoning-gym", "tasks": [
        {"task": "chain_sum", "weight": 0}, {"task": "leg_counting", "settings": {"max_animals": 99}}, "x"]})
    assert problems == ["dataset.tasks[0].weight must be a finite number > 0 (got 0)",
                        "dataset.tasks[1].settings.max_animals must be an integer in 1..37 (got 99)",
                        "dataset.tasks[2] must be a dict like {'task': 'chain_sum', 'weight': 1} (got 'x')"]
    assert "dataset.settings.max_terms must be an integer in 2..12" in validate_task_spec(
        {**ok, "settings": {"max_terms": 20}})[0]


def test_a_run_spec_with_a_task_source_is_scored_by_the_task_checker_only():
    dataset = {"source": "reasoning-gym", "task": "leg_counting", "settings": {"max_animals": 4}, "num_prompts": 3,
               "eval_size": 2, "seed": 1}
    spec = RunSpec.from_dict({"model": "m", "dataset": dataset})
    assert spec.rewards == [{"name": "task_checker", "weight": 1.0}]  # the default for a task source
    with pytest.raises(ValueError, match="scored by its task's own answer checker, made binary"):
        RunSpec.from_dict({"model": "m", "dataset": dataset, "rewards": [{"name": "exact_match", "weight": 1.0}]})
    with pytest.raises(ValueError, match="scored by its task's own answer checker"):
        RunSpec.from_dict({"model": "m", "dataset": dataset, "rewards": [{"name": "task_checker", "weight": 0.5}]})
    with pytest.raises(ValueError, match="'task_checker' scores reasoning-gym tasks and needs dataset.source"):
        RunSpec.from_dict({"model": "m", "dataset": {"source": "arithmetic"}, "rewards": [{"name": "task_checker"}]})
    with pytest.raises(ValueError, match="dataset.settings.max_animals must be an integer in 1..37"):
        RunSpec.from_dict({"model": "m", "dataset": {**dataset, "settings": {"max_animals": 0}}})
    train, held_out = spec.build_datasets()
    assert (len(train), len(held_out)) == (3, 2)
    assert train.to_list() == datasets_from_spec(dataset)[0].to_list()
    mix = {"source": "reasoning-gym", "tasks": [{"task": "chain_sum", "weight": 2, "settings": {"max_terms": 3}},
                                                {"task": "countdown", "weight": 1}], "num_prompts": 5, "eval_size": 0,
           "seed": 2}
    for original in (spec, RunSpec.from_dict({"model": "m", "dataset": mix})):
        command, script, _, fields = parse(original.to_cli_args())
        again = spec_from_args(command, script, fields)
        assert again.dataset == original.dataset and again.rewards == original.rewards


def test_preview_shows_the_first_prompts_with_their_answers():
    rows = preview_tasks("leg_counting", n=3)
    assert [set(r) for r in rows] == [{"task", "prompt", "answer"}] * 3
    assert rows[0]["prompt"].startswith("Your task is to count how many legs") and rows[0]["answer"].isdigit()
    spec = {"source": "reasoning-gym", "tasks": [{"task": "chain_sum"}, {"task": "gsm_symbolic"}], "seed": 7}
    train, _ = datasets_from_spec({**spec, "num_prompts": 4, "eval_size": 0})
    assert [r["answer"] for r in preview_tasks(spec, n=4)] == train["ground_truth"]


@pytest.mark.slow
def test_a2po_works_without_reasoning_gym_until_a_task_is_generated():
    code = ("import sys; sys.modules['reasoning_gym'] = None\n"  # makes `import reasoning_gym` fail
            "import a2po, a2po.data, a2po.tasks, a2po.runspec\n"
            "from a2po.runspec import RunSpec\n"
            "spec = RunSpec.from_dict({'model': 'm', 'dataset': {'source': 'reasoning-gym', 'task': 'chain_sum'}})\n"
            "try:\n    spec.build_datasets()\nexcept ImportError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert INSTALL_HINT in result.stdout


def test_reward_problems_is_silent_for_other_sources():
    assert reward_problems("arithmetic", [{"name": "exact_match"}]) == []
    assert reward_problems("reasoning-gym", [{"name": "task_checker", "weight": 1.0}]) == []


def test_a_tiny_model_trains_a_step_on_every_task_through_the_library(tmp_path, tiny_model_dir):
    train, held_out = mixed_task_dataset([{"task": t} for t in LISTED], 5, seed=0, eval_size=5)
    assert Counter(train["task"]) == dict.fromkeys(LISTED, 1)  # one batch, one step: every task in it
    args = A2POConfig(output_dir=str(tmp_path), per_device_train_batch_size=5, max_steps=1, num_value_samples=2,
                      max_completion_length=8, max_prompt_length=64, use_cpu=True, report_to="none",
                      gradient_checkpointing=False, filter_all_incorrect=False, save_strategy="no",
                      disable_tqdm=True)
    trainer = A2POTrainer(model=tiny_model_dir, reward_funcs=get_reward_function("task_checker"), args=args,
                          train_dataset=train, eval_dataset=held_out)
    rows = train.to_list()
    answers = [f"<answer>{r['ground_truth']}</answer>" for r in rows]
    total = trainer._score(rows, answers, [trainer.processing_class.encode(a) for a in answers]).total
    assert total.tolist() == [1.0] * 5  # the trainer hands the task columns to the checker
    trainer.train()
    assert trainer.state.global_step == 1
    table = trainer.value_tables["train"].to_list()
    assert len(table) == 5 and all(set(r["rewards"]) <= {0.0, 1.0} for r in table)
    assert {json.loads(json.dumps(r["prompt"]))[0]["content"] for r in table} == {r["prompt"][0]["content"]
                                                                                  for r in rows}
    metrics = trainer.evaluate()
    # A mix reports accuracy per task, each the mean over that task's held-out prompts.
    per_task = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("eval_accuracy/")}
    counts = Counter(held_out["task"])
    assert set(per_task) == set(counts) and len(per_task) > 1
    assert sum(per_task[t] * counts[t] for t in counts) / len(held_out) == pytest.approx(metrics["eval_accuracy"])


def test_a_tiny_model_trains_a_step_on_tasks_through_the_cli(tmp_path, tiny_model_dir, capsys):
    common = ["--model", tiny_model_dir, "--dataset", "reasoning-gym", "--num_prompts", "5", "--eval_size", "2",
              "--num_value_samples", "2", "--max_completion_length", "4", "--max_prompt_length", "48",
              "--per_device_train_batch_size", "5", "--max_steps", "1", "--use_cpu", "true",
              "--gradient_checkpointing", "false", "--filter_all_incorrect", "false", "--save_strategy", "no",
              "--disable_tqdm", "true"]
    mix = json.dumps([{"task": t, "weight": 1} for t in LISTED])
    assert main(["train", *common, "--tasks", mix, "--output_dir", str(tmp_path / "mix")]) == 0
    assert (tmp_path / "mix" / "model.safetensors").exists()
    assert main(["train", *common, "--task", "chain_sum", "--task_settings", '{"max_terms": 3}',
                 "--output_dir", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    finals = [json.loads(line) for line in out.splitlines() if line.startswith('{"eval_accuracy"')]
    assert len(finals) == 2 and all(0.0 <= f["eval_accuracy"] <= 1.0 for f in finals)
    with pytest.raises(SystemExit, match="needs --task NAME"):
        main(["train", *common])
    with pytest.raises(SystemExit, match="--task_settings must be JSON"):
        main(["train", *common, "--task", "chain_sum", "--task_settings", "max_terms=3"])
    with pytest.raises(SystemExit, match="own answer checker"):
        main(["train", *common, "--task", "chain_sum", "--reward", "exact_match"])


@pytest.mark.parametrize("name", [n for n in LISTED if TASKS[n].numeric])
def test_numeric_tasks_can_ask_for_just_the_number_and_score_the_last_one(name):
    train, _ = task_dataset(name, 3, seed=5, answer_format="number")
    rows = train.to_list()
    assert all(row["prompt"][0]["content"].endswith(NUMBER_INSTRUCTION) for row in rows)
    assert all(row["answer_format"] == "number" for row in rows)
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    prompts = [row["prompt"] for row in rows]
    right = [f"Adding up, 1 + 1 = 2, so the answer is {row['ground_truth']}." for row in rows]
    assert task_checker(prompts=prompts, completions=right, **columns) == [1.0] * 3
    wrong = [f"It is {row['ground_truth']}, no wait, {Decimal(row['ground_truth']) + 1}" for row in rows]
    assert task_checker(prompts=prompts, completions=wrong, **columns) == [0.0] * 3
    assert task_checker(prompts=prompts, completions=["no idea"] * 3, **columns) == [0.0] * 3


def test_answer_format_is_checked_and_number_refused_for_expression_answers():
    base = {"source": "reasoning-gym", "task": "chain_sum", "settings": FEW_PROMPTS}
    assert validate_task_spec({**base, "answer_format": "number"}) == []
    assert "answer_format must be one of" in " ".join(validate_task_spec({**base, "answer_format": "boxed"}))
    problems = validate_task_spec({"source": "reasoning-gym", "task": "countdown", "answer_format": "number"})
    assert "countdown answers are expressions: use 'tags'" in " ".join(problems)
    mix = {"source": "reasoning-gym", "answer_format": "number",
           "tasks": [{"task": "chain_sum"}, {"task": "countdown"}]}
    assert "countdown" in " ".join(validate_task_spec(mix))
    with pytest.raises(ValueError, match="answers are not"):
        task_dataset("countdown", 2, answer_format="number")


def test_answer_format_through_the_cli_and_back():
    command, script, _, fields = parse(["train", "--dataset", "reasoning-gym", "--task", "chain_sum",
                                        "--task_settings", json.dumps(FEW_PROMPTS), "--answer_format", "number",
                                        "--system_prompt", ""])
    spec = spec_from_args(command, script, fields)
    assert spec.dataset["answer_format"] == "number" and spec.dataset["system_prompt"] == ""
    train, held_out = spec.build_datasets()
    assert train[0]["prompt"][0] == {"role": "system", "content": ""}
    assert train[0]["prompt"][1]["content"].endswith(NUMBER_INSTRUCTION)
    command, script, _, fields = parse(spec.to_cli_args())
    again = spec_from_args(command, script, fields)
    assert again.dataset["answer_format"] == "number" and again.dataset["system_prompt"] == ""
