"""The Explain page's pictures, from plain rows: the V* calculator against hand-computed values, the regression
scatter and one prompt's trajectory."""

import pytest

from a2po.answers import prompt_question
from app.web.pages.explain import calculator, optimal_value, prompt_figure, regression_figure, value_curve_figure


@pytest.mark.parametrize(("k", "expected"), [(0, 0.0), (1, 0.2935), (2, 0.4772), (4, 0.7169), (8, 1.0)])
def test_calculator_values_match_the_paper_table(k, expected):
    assert optimal_value(k, 8, 0.5) == pytest.approx(expected, abs=1e-4)


def test_calculator_text_and_curve():
    text, figure = calculator(8, 0.5, 1)
    assert "**V\\* = 0.2935** for 1 correct of N = 8 at β₁ = 0.5" in text
    names = [trace.name for trace in figure.data]
    assert names[:3] == ["V* (β₁ = 0.5)", "plain mean k/N", "max"]
    assert list(figure.data[0].y) == pytest.approx([optimal_value(k, 8, 0.5) for k in range(9)])
    assert calculator(8, 0.5, 20)[0].startswith("**V\\* = 1.0000** for 8 correct")  # k clipped to N
    assert calculator(8, 0, 1)[0] == "β₁ must be > 0."
    assert len(value_curve_figure(1, 2.0, 0).data[0].x) == 2


def test_regression_scatter_and_prompt_trajectory():
    samples = [{"step": s, "implicit_reward": 0.1 * s, "advantage": 0.7, "reward": 1.0, "v_star": 0.3,
                "completion": "12", "prompt_id": "p"} for s in (1, 2, 3)]
    figure = regression_figure(samples)
    assert list(figure.data[0].x) == pytest.approx([0.1, 0.2, 0.3]) and list(figure.data[0].marker.color) == [1, 2, 3]
    assert figure.data[1].name.startswith("target")
    assert regression_figure([]).layout.annotations[0].text == "No training samples yet"
    trajectory = prompt_figure(samples, 0.3)
    assert list(trajectory.data[0].x) == [1, 2, 3]
    assert [shape.y0 for shape in trajectory.layout.shapes] == pytest.approx([0.7, -0.3])


def test_questions_not_templates():
    messages = [{"role": "system", "content": "You are SmolLM"}, {"role": "user", "content": "What is 2 + 3?"}]
    assert prompt_question(messages) == "What is 2 + 3?" and prompt_question("raw text") == "raw text"


def test_pass_at_n_is_explained_as_what_stage_1_keeps_with_the_runs_figures():
    from app.web.pages.explain import pass_at_n_text

    text = pass_at_n_text([], [], None)
    assert "train on" in text and "not a limit" in text
    evaluations = [{"step": 0, "metrics": {"eval_accuracy": 0.0625, "eval_ref_pass_at_1": 0.02,
                                           "eval_ref_pass_at_n": 0.125}},
                   {"step": 18, "metrics": {"eval_accuracy": 0.39}}]
    final = [{"step": 18, "reward": 1.0, "v_star": 0.0}, {"step": 18, "reward": 1.0, "v_star": 0.29},
             {"step": 18, "reward": 0.0, "v_star": 0.0}, {"step": 0, "reward": 1.0, "v_star": 0.0}]
    text = pass_at_n_text(evaluations, final, 8)
    assert "reference pass@8 **12%**" in text and "**6%** at step 0" in text and "**39%** at step 18" in text
    assert "**1** of the 3 held-out prompts" in text  # right at step 18 although V* = 0


def test_explain_says_which_engine_sampled_the_run():
    from app.web.pages.explain import engine_text

    native = engine_text({"config": {"use_vllm": False}})
    assert native.startswith("**Sampled by the native decoder**") and "stage 1's reference samples" in native
    assert engine_text(None) == engine_text({}) == native  # a spec from before vLLM: the native decoder sampled it
    vllm = engine_text({"method": "grpo", "config": {"use_vllm": True}})
    assert vllm.startswith("**Sampled by vLLM**, colocated") and "groups of G answers" in vllm
    assert "stage 1" not in vllm and "trainer's own forward passes" in vllm
