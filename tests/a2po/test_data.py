import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json  # noqa: E402
import re  # noqa: E402

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from datasets import Dataset, DatasetDict  # noqa: E402

from a2po.answers import prompt_question  # noqa: E402
from a2po.data import (  # noqa: E402
    GSM8K_INSTRUCTION,
    MATH_INSTRUCTION,
    arithmetic_dataset,
    load_prompt_dataset,
    preview_rows,
    train_eval_split,
)

QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\? Answer with just the number\.")


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    # Loading local files writes Arrow caches; keep them out of the user's ~/.cache.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets_cache")


def _questions(ds):
    return [p[0]["content"] if isinstance(p, list) else p for p in ds["prompt"]]


def test_arithmetic_ground_truths_and_operand_ranges():
    for difficulty, (low, high) in {1: (0, 9), 2: (10, 99), 3: (100, 999), 4: (1000, 9999)}.items():
        ds = arithmetic_dataset(num_prompts=60, operations="+-*", difficulty=difficulty, seed=3)
        assert ds.column_names == ["prompt", "ground_truth", "operation", "difficulty"]
        for question, truth, op, d in zip(_questions(ds), ds["ground_truth"], ds["operation"], ds["difficulty"]):
            a, sym, b = QUESTION.fullmatch(question).groups()
            a, b = int(a), int(b)
            assert low <= a <= high and low <= b <= high
            assert sym == op and d == difficulty
            assert truth == str({"+": a + b, "-": a - b, "*": a * b}[op])
        assert set(ds["operation"]) == {"+", "-", "*"}


def test_arithmetic_prompt_format():
    ds = arithmetic_dataset(num_prompts=2, seed=0)
    assert ds[0]["prompt"][0]["role"] == "user" and len(ds[0]["prompt"]) == 1
    assert QUESTION.fullmatch(ds[0]["prompt"][0]["content"])
    plain = arithmetic_dataset(num_prompts=2, seed=0, chat=False)
    assert plain["prompt"] == _questions(ds)
    assert plain["ground_truth"] == ds["ground_truth"]


def test_arithmetic_is_deterministic_per_seed():
    a = arithmetic_dataset(50, "+-", 2, seed=7)
    assert a.to_list() == arithmetic_dataset(50, "+-", 2, seed=7).to_list()
    assert a["prompt"] != arithmetic_dataset(50, "+-", 2, seed=8)["prompt"]
    assert arithmetic_dataset(10, ["-", "+"], 2, seed=7).column_names == a.column_names


def test_arithmetic_has_no_duplicates_while_space_allows():
    full = arithmetic_dataset(num_prompts=100, operations="+", difficulty=1)  # exactly the 10 * 10 questions
    assert len(set(_questions(full))) == 100
    assert len(set(_questions(arithmetic_dataset(300, "+-*", 1)))) == 300
    assert len(set(_questions(arithmetic_dataset(2000, "*", 3)))) == 2000
    over = _questions(arithmetic_dataset(num_prompts=150, operations="+", difficulty=1))
    assert len(over) == 150 and len(set(over)) == 100  # past the space size, every question appears


@pytest.mark.parametrize("kwargs, message", [
    ({"num_prompts": 0}, "num_prompts must be an integer >= 1"),
    ({"difficulty": 5}, "must be 1..4"),
    ({"difficulty": 0}, "must be 1..4"),
    ({"difficulty": 2.0}, "must be 1..4"),
    ({"operations": "+/"}, "Unknown operations"),
    ({"operations": []}, "Unknown operations"),
])
def test_arithmetic_validates_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        arithmetic_dataset(**kwargs)


def test_train_eval_split():
    ds = arithmetic_dataset(20, seed=1)
    train, held = train_eval_split(ds, eval_size=5, seed=0)
    assert (len(train), len(held)) == (15, 5)
    assert set(_questions(train)).isdisjoint(_questions(held))
    assert set(_questions(train)) | set(_questions(held)) == set(_questions(ds))
    assert [len(s) for s in train_eval_split(ds, eval_size=0.25)] == [15, 5]
    assert train_eval_split(ds, 5, seed=0)[1]["prompt"] == held["prompt"]
    assert [len(s) for s in train_eval_split(ds, eval_size=np.int64(4))] == [16, 4]
    for bad in (0, 20, 1.5, 0.0, "5"):
        with pytest.raises(ValueError, match="eval_size"):
            train_eval_split(ds, bad)


def test_gsm8k_jsonl(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": "Tom has 3 apples and buys 1,000 more. How many?", "answer": "3 + 1000 = 1003\n#### 1,003"},
        {"question": "What is 6 times 7?", "answer": "6 * 7 = <<6*7=42>>42\n#### 42"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load_prompt_dataset(str(path))
    assert ds["ground_truth"] == ["1003", "42"]
    assert ds["question"] == [r["question"] for r in rows] and ds["answer"] == [r["answer"] for r in rows]
    prompt = ds[1]["prompt"]
    assert prompt == [{"role": "user", "content": f"What is 6 times 7?\n\n{GSM8K_INSTRUCTION}"}]
    assert "'####'" in GSM8K_INSTRUCTION


def test_math_parquet_with_nested_boxed_solution(tmp_path):
    path = tmp_path / "math.parquet"
    Dataset.from_dict({
        "problem": ["Simplify $\\sqrt{2}/2$.", "Compute $1+1$."],
        "solution": ["It equals $\\boxed{\\frac{\\sqrt{2}}{2}}$.", "So $\\boxed{2}$."],
        "level": ["Level 2", "Level 1"],
    }).to_parquet(str(path))
    ds = load_prompt_dataset(str(path))
    assert ds["ground_truth"] == ["\\frac{\\sqrt{2}}{2}", "2"]
    assert ds["level"] == ["Level 2", "Level 1"]
    assert ds[1]["prompt"][0]["content"] == f"Compute $1+1$.\n\n{MATH_INSTRUCTION}"
    assert "\\boxed{}" in MATH_INSTRUCTION


def test_math_prefers_answer_column(tmp_path):
    path = tmp_path / "math500.json"
    path.write_text(json.dumps([{"problem": "Half of one?", "solution": "... \\boxed{0.5}", "answer": "\\frac12"}]))
    ds = load_prompt_dataset(str(path))
    assert ds["ground_truth"] == ["\\frac12"]
    assert ds[0]["prompt"][0]["content"].endswith(MATH_INSTRUCTION)


def test_csv_with_explicit_columns_and_numeric_answers(tmp_path):
    path = tmp_path / "custom.csv"
    path.write_text("q,a,source\n2+2?,4,x\n3*3?,9,y\n")
    with pytest.raises(ValueError, match=r"no prompt column among \['q', 'a', 'source'\].*pass prompt_column="):
        load_prompt_dataset(str(path))
    ds = load_prompt_dataset(str(path), prompt_column="q", answer_column="a")
    assert ds["ground_truth"] == ["4", "9"]
    assert ds["prompt"] == [[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "3*3?"}]]
    assert ds["source"] == ["x", "y"]
    with pytest.raises(ValueError, match="answer_column='nope' is not a column"):
        load_prompt_dataset(str(path), prompt_column="q", answer_column="nope")


def test_existing_prompt_column_is_kept_verbatim(tmp_path):
    path = tmp_path / "ready.jsonl"
    path.write_text(json.dumps({"prompt": "Say 5.", "ground_truth": 5}) + "\n")
    ds = load_prompt_dataset(str(path))
    assert ds[0]["prompt"] == "Say 5." and ds[0]["ground_truth"] == "5"  # TRL's "standard" format: no template
    assert ds.features["ground_truth"].dtype == "string"  # not cast back to the file's int column
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "Say 5."}], "answer": "5"}) + "\n")
    assert load_prompt_dataset(str(chat))[0]["prompt"] == [{"role": "user", "content": "Say 5."}]


def test_a_system_prompt_for_plain_text_prompts_is_refused_not_dropped(tmp_path):
    from a2po.data import with_system_prompt

    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"prompt": "Say 5.", "answer": "5"}) + "\n")
    plain = load_prompt_dataset(str(path))
    with pytest.raises(ValueError, match="plain text, which is used verbatim"):
        with_system_prompt(plain, "Be brief.")
    assert with_system_prompt(plain, "")[0]["prompt"] == "Say 5."  # an empty system message has nothing to drop


def test_a_base_model_without_a_chat_template_runs_stage_one_on_plain_prompts(tmp_path):
    from a2po import A2POConfig, A2POTrainer
    from a2po.rewards import exact_match
    from a2po.testing import make_tiny_model

    model, tokenizer = make_tiny_model()
    tokenizer.chat_template = None  # a base model
    path = tmp_path / "plain.jsonl"
    texts = [f"Q: {i} + 1 =\nA:" for i in range(4)]
    path.write_text("".join(json.dumps({"prompt": t, "answer": str(i + 1)}) + "\n" for i, t in enumerate(texts)))
    ds = load_prompt_dataset(str(path))
    args = A2POConfig(output_dir=str(tmp_path / "out"), num_value_samples=2, max_completion_length=4, use_cpu=True,
                      report_to="none", per_device_train_batch_size=4, filter_all_incorrect=False)
    trainer = A2POTrainer(model=model, processing_class=tokenizer, reward_funcs=exact_match, args=args,
                          train_dataset=ds)
    table = trainer.estimate_optimal_values()
    assert sorted(table["prompt_text"]) == sorted(texts)  # what the model saw: the file's text, verbatim
    assert sorted(table["prompt"]) == sorted(texts)


def test_missing_answer_column_and_bad_paths(tmp_path):
    path = tmp_path / "no_answer.jsonl"
    path.write_text(json.dumps({"question": "Why?"}) + "\n")
    with pytest.raises(ValueError, match="no answer column.*pass answer_column="):
        load_prompt_dataset(str(path))
    with pytest.raises(FileNotFoundError, match="No such file"):
        load_prompt_dataset(str(tmp_path / "missing.jsonl"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="Unsupported file type '.txt'"):
        load_prompt_dataset(str(tmp_path / "notes.txt"))


def test_saved_dataset_dict_split(tmp_path):
    data = {"question": ["1+1?"], "answer": ["#### 2"]}
    DatasetDict({"test": Dataset.from_dict(data)}).save_to_disk(str(tmp_path / "saved"))
    assert load_prompt_dataset(str(tmp_path / "saved"), split="test")["ground_truth"] == ["2"]
    with pytest.raises(ValueError, match=r"no split 'train'; it has \['test'\]"):
        load_prompt_dataset(str(tmp_path / "saved"))


def test_preview_rows():
    ds = arithmetic_dataset(3, seed=0)
    rows = preview_rows(ds, n=2)
    assert len(rows) == 2 and rows[0]["prompt"] == ds[0]["prompt"][0]["content"]
    assert rows[0]["ground_truth"] == ds[0]["ground_truth"] and rows[0]["operation"] == "+"
    assert len(preview_rows(ds, n=10)) == 3
    multi = Dataset.from_dict({"prompt": [[{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hi"}]]})
    assert preview_rows(multi)[0]["prompt"] == "system: Be brief.\n\nuser: Hi"


def test_system_prompt_replaces_or_adds_the_system_message_of_chat_prompts():
    dataset = Dataset.from_list([
        {"prompt": [{"role": "user", "content": "2 + 2?"}], "ground_truth": "4"},
        {"prompt": [{"role": "system", "content": "old"}, {"role": "user", "content": "3 + 3?"}], "ground_truth": "6"}])
    text = Dataset.from_list([{"prompt": "plain text", "ground_truth": "x"}])
    from a2po import data

    out = data.with_system_prompt(dataset, "")
    assert out[0]["prompt"] == [{"role": "system", "content": ""}, {"role": "user", "content": "2 + 2?"}]
    assert out[1]["prompt"] == [{"role": "system", "content": ""}, {"role": "user", "content": "3 + 3?"}]
    assert data.with_system_prompt(text, "")[0]["prompt"] == "plain text"  # no chat template for text prompts
    assert data.with_system_prompt(dataset, None)[0]["prompt"] == dataset[0]["prompt"]
    assert prompt_question(out[1]["prompt"]) == "3 + 3?"
    with pytest.raises(ValueError, match="system_prompt must be a string"):
        data.with_system_prompt(dataset, 3)

