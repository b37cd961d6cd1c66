"""Launch-form validation: one message per bad input, next to the right field; a valid spec for good input."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2po.runspec import RunSpec
from a2po.testing import make_tiny_model
from app import forms


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "tiny"  # named "tiny": the generated run name uses it
    make_tiny_model(path)
    return str(path)


def form(**changes) -> dict:
    values = forms.default_form()
    values.update(changes)
    return values


def errors_of(**changes) -> dict[str, str]:
    result = forms.validate_form(form(**changes))
    assert result.spec is None
    return result.errors


def test_default_form_gives_a_valid_spec():
    result = forms.validate_form(form())
    assert result.ok, result.errors
    spec = result.spec
    assert spec["action"] == "train"
    assert spec["model"] == "SmolLM2-135M-Instruct"
    assert spec["dataset"] == {"source": "arithmetic", "num_prompts": 128, "difficulty": 2, "operations": "+",
                               "seed": 0, "eval_size": 32}
    assert spec["rewards"] == [{"name": "exact_match", "weight": 1.0}]
    assert spec["config"]["beta1"] == 0.5 and spec["config"]["num_value_samples"] == 8
    assert None not in spec["config"].values()  # "0 means off" fields are left to the library default
    assert "top_k" not in spec["config"]
    assert spec["peft"] is None
    RunSpec.from_dict(spec)  # the library accepts what the form builds


def test_spec_for_tiny_model_with_lora_and_two_rewards(tiny_model):
    result = forms.validate_form(form(model=tiny_model, action="values", lora=True, lora_r=4, lora_alpha=8,
                                      rewards={"exact_match": 1.0, "math_equivalence": 0.5}, top_k=20,
                                      operations="+-", name=""))
    assert result.ok, result.errors
    spec = result.spec
    assert spec["model"] == tiny_model and spec["action"] == "values"
    assert spec["peft"] == {"r": 4, "lora_alpha": 8}
    assert spec["rewards"][1] == {"name": "math_equivalence", "weight": 0.5}
    assert spec["config"]["top_k"] == 20
    assert spec["dataset"]["operations"] == "+-"
    assert spec["name"] == "tiny-arithmetic"  # generated from model and dataset when left empty


@pytest.mark.parametrize(("model", "message"), [
    ("", "Choose a model"),
    ("/nonexistent/model/dir", "No model folder at /nonexistent/model/dir"),
    ("not a model!", "Unknown model"),
])
def test_bad_models(model, message):
    assert message in errors_of(model=model)["model"]


def test_folder_without_config_is_not_a_model(tmp_path):
    assert "no config.json" in errors_of(model=str(tmp_path))["model"]


def test_hub_model_must_be_cached_when_offline():
    assert forms.check_model("some-org/not-cached-model", offline=False) is None
    assert "not in the local Hugging Face cache" in forms.check_model("some-org/not-cached-model", offline=True)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("beta1", 0, "β₁ (V* temperature) must be > 0 (got 0)"),
    ("beta1", -0.5, "must be > 0"),
    ("beta2", 0, "must be > 0"),
    ("learning_rate", "abc", "enter a number"),
    ("num_value_samples", 0, "must be at least 1"),
    ("per_device_train_batch_size", 2.5, "must be a whole number"),
    ("max_steps", 0, "must be -1 (use epochs) or at least 1"),
    ("top_p", 1.5, "must be in (0, 1]"),
    ("temperature", 0, "must be > 0"),
    ("top_k", -1, "must be 0 or more"),
])
def test_impossible_hyper_parameters(field, value, message):
    errors = errors_of(**{field: value})
    assert list(errors) == [field]
    assert message in errors[field]


def test_arithmetic_dataset_errors():
    assert "0 or more" in errors_of(eval_size=-1)["eval_size"]
    assert "at least 1" in errors_of(num_prompts=0)["num_prompts"]
    assert "Pick at least one operation" in errors_of(operations="")["operations"]
    assert "1 to 4" in errors_of(difficulty=9)["difficulty"]


def test_file_dataset_errors(tmp_path):
    assert "Upload" in errors_of(dataset_source="file", file_path="")["file_path"]
    assert "No file at" in errors_of(dataset_source="file", file_path=str(tmp_path / "x.jsonl"))["file_path"]
    bad = tmp_path / "data.txt"
    bad.write_text("hello")
    assert "Unsupported file type '.txt'" in errors_of(dataset_source="file", file_path=str(bad))["file_path"]


def test_hub_dataset_needs_an_id():
    assert "hub dataset id" in errors_of(dataset_source="hub", hub_name="bad id with spaces")["hub_name"]
    result = forms.validate_form(form(dataset_source="hub", hub_name="openai/gsm8k", answer_column="answer"))
    assert result.ok, result.errors
    assert result.spec["dataset"] == {"source": "hub", "name": "openai/gsm8k", "config_name": "main",
                                      "split": "train", "prompt_column": None, "answer_column": "answer",
                                      "eval_size": 32}


def test_column_checks(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "1+1?", "label": "2"}\n')
    values = form(dataset_source="file", file_path=str(data))
    errors = forms.validate_form(values, columns=["text", "label"]).errors
    assert "No `prompt` column" in errors["prompt_column"]
    assert "Reward exact_match needs a `ground_truth` column" in errors["answer_column"]

    values.update(prompt_column="text", answer_column="label")
    assert forms.validate_form(values, columns=["text", "label"]).ok

    values.update(answer_column="solution")
    assert "No `solution` column" in forms.validate_form(values, columns=["text", "label"]).errors["answer_column"]
    # The library's usual names (GSM8K's question/answer) need no mapping.
    assert forms.validate_form(form(dataset_source="file", file_path=str(data)), columns=["question", "answer"]).ok


def test_reward_errors():
    assert "Pick at least one reward" in errors_of(rewards={})["rewards"]
    assert "Weight of exact_match must be a number > 0" in errors_of(rewards={"exact_match": 0})["rewards"]


def test_lora_errors():
    errors = errors_of(lora=True, lora_r=0, lora_alpha=-1)
    assert set(errors) == {"lora_r", "lora_alpha"}
    assert forms.validate_form(form(lora=False, lora_r=0)).ok  # ignored while LoRA is off


def test_reward_columns_come_from_the_reward_signature():
    assert forms.reward_columns("exact_match") == ["ground_truth"]


def test_command_line_renders_the_spec():
    spec = forms.validate_form(form(max_steps=7)).spec
    command = forms.command_line(spec)
    assert command.startswith("python -m a2po train ")
    assert "--model SmolLM2-135M-Instruct" in command
    assert "--max_steps 7" in command and "--beta1 0.5" in command


def test_validate_spec_for_the_api(tmp_path):
    assert forms.validate_spec({"model": str(tmp_path / "missing")}).startswith("model: No model folder")
    assert "dataset.path" in forms.validate_spec({"dataset": {"source": "file", "path": str(tmp_path / "x.csv")}})
    assert "beta1 must be > 0" in forms.validate_spec({"config": {"beta1": 0}})
    assert "unknown spec keys" in forms.validate_spec({"colour": "red"})
    assert forms.validate_spec({"action": "values"}) is None
    assert forms.validate_spec([1, 2]) == "The spec must be a JSON object."


def test_default_run_name():
    assert forms.default_run_name("org/Model-1", {"source": "hub", "name": "openai/gsm8k"}) == "Model-1-gsm8k"
    assert forms.default_run_name(str(Path("/x/tiny/")), {"source": "file", "path": "/d/my.jsonl"}) == "tiny-my"
