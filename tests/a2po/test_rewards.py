import os

os.environ["HF_HUB_OFFLINE"] = "1"

import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402

from a2po.answers import completion_text, extract_final_answer  # noqa: E402
from a2po.reward_registry import get_reward_function  # noqa: E402
from a2po.rewards import REWARD_FUNCTIONS, exact_match, math_equivalence  # noqa: E402


@pytest.mark.parametrize("text, expected", [
    ("so the answer is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("first \\boxed{3}, then \\boxed{\\frac{\\sqrt{2}}{2}}.", "\\frac{\\sqrt{2}}{2}"),  # last box, nested braces
    ("\\boxed{5} but #### 7", "5"),  # boxed beats ####
    ("3 + 1000 = 1003\n#### 1,003", "1003"),
    ("#### 42\nHope this helps, 99 times over", "42"),  # only the line after ####
    ("#### $18.", "18"),
    ("The total is 12 then 5 - 9 = -4", "-4"),
    ("Answer: 3-4", "4"),  # a minus right after a digit is subtraction, not a sign
    ("We have 1,234,567 apples.", "1234567"),
    ("It costs $3.50.", "3.50"),
    ("I have no idea.", None),
    ("", None),
    ("#### ", None),
    ("\\boxed{7", "7"),  # unclosed box: fall back to the last number
])
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_completion_text_handles_strings_and_conversations():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "b"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "x"}]}]) == "x"


@pytest.mark.parametrize("reward, cases", [
    ("exact_match", [("68", "68", 1.0), ("68.00", "68", 1.0), ([{"role": "assistant", "content": "23 + 45 = 68."}],
                     "68.0", 1.0), ("23 + 45 = 67", "68", 0.0), ("no answer", "68", 0.0), ("#### 1,234", "1234", 1.0)]),
    ("math_equivalence", [("The answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0), ("So it is $\\frac{2}{4}$", "0.5", 1.0),
                          ([{"role": "assistant", "content": "\\boxed{\\frac{1}{\\sqrt{2}}}"}],
                           "\\frac{\\sqrt{2}}{2}", 1.0),
                          ("#### 1/2", "0.5", 1.0), ("\\boxed{0.6}", "\\frac{1}{2}", 0.0),
                          ("I give up", "\\frac{1}{2}", 0.0)]),
])
def test_answers_strings_and_conversations(reward, cases):
    """Equal answers score 1 whatever their form (exact_match: numbers; math_equivalence: expressions)."""
    completions, truths, expected = zip(*cases, strict=True)
    scores = REWARD_FUNCTIONS[reward](list(completions), ground_truth=list(truths), prompts=["p"] * len(cases))
    assert scores == list(expected)


def test_exact_match_rejects_mismatched_ground_truth():
    with pytest.raises(ValueError, match="one answer per completion"):
        exact_match(["1", "2"], ground_truth=["1"])
    with pytest.raises(ValueError, match="got a string"):
        exact_match(["1"], ground_truth="1")


def test_math_equivalence_falls_back_to_exact_match():
    # math_verify parses neither side of a word answer; exact_match still decides.
    assert math_equivalence(["\\boxed{yes}", "\\boxed{no}"], ground_truth=["yes", "yes"]) == [1.0, 0.0]


def test_math_equivalence_works_in_threads_and_skips_huge_powers():
    # signal-based timeouts would raise outside the main thread; a power tower would hang sympy without a guard.
    completions = ["\\boxed{\\frac{1}{2}}", "\\boxed{2^{2^{2^{100}}}}"]
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: math_equivalence([c], ground_truth=["0.5"])[0], completions))
    assert results == [1.0, 0.0]
    assert time.perf_counter() - start < 5


def test_registry_and_names():
    assert get_reward_function("exact_match") is exact_match
    assert get_reward_function(" Math_Equivalence ") is math_equivalence
    assert {name: f.__name__ for name, f in REWARD_FUNCTIONS.items()} == {
        "exact_match": "exact_match", "math_equivalence": "math_equivalence", "task_checker": "task_checker"}
    with pytest.raises(ValueError, match="known names: exact_match, math_equivalence, task_checker"):
        get_reward_function("accuracy")
