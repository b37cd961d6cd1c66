"""What the Run page shows a class: the question instead of the chat template, accuracy before and after
training, readable charts (flat and one-point series, log scale, a time axis) and a run cloned into the Launch
form through the allow-list. Real SQLite file; the figures are the specs the browser draws."""

from __future__ import annotations

import math

import pytest

from a2po.runspec import RunSpec, with_defaults
from app.access import allowlist
from app.access.policy import Policy
from app.web import charts, forms
from app.web.pages.completions import samples_frame
from app.web.pages.run.builders import training_view
from app.web.pages.run.frame import ChartOptions
from app.web.pages.run.header import accuracy_change, header
from app.web.pages.values import filtered_frame, prompt_detail, values_frame
from storage import Store

TEMPLATE = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "studio.db")


def test_tables_show_the_question_and_the_detail_keeps_the_template(store):
    vs = store.get_or_create_value_set("fp", {})
    run_id = store.create_run("r", "train", {}, model="m", dataset="d")
    store.update_run(run_id, value_set_id=vs)
    question = "What is 17 + 25? Answer with a number."
    records = [
        {"prompt_id": "p0", "prompt": [{"role": "user", "content": question}],
         "prompt_text": TEMPLATE.format(q=question), "v_star": 0.0, "rewards": [0.0, 0.0],
         "completions": ["41", "43"], "num_correct": 0, "filtered": True},
        {"prompt_id": "p1", "prompt": "plain 2 + 2", "prompt_text": "plain 2 + 2", "v_star": 0.5,
         "rewards": [1.0, 0.0], "completions": ["4", "5"], "num_correct": 1, "filtered": False},
    ]
    store.add_values(vs, "train", records)
    store.set_run_values(run_id, "train", records)
    page = store.values_page(run_id, "train")
    assert [row["question"] for row in page] == [question, "plain 2 + 2"]
    assert store.values_after(run_id, "train", 0)[0]["question"] == question
    frame = values_frame(page, 2)
    assert list(frame["question"]) == [question, "plain 2 + 2"]
    assert "system" not in frame["question"][0]
    assert list(filtered_frame(page, 2)["question"]) == [question]
    text, completions = prompt_detail(store.get_value(run_id, "train", "p0"), "p0")
    assert "You are a helpful AI assistant" in text and list(completions["completion"]) == ["41", "43"]
    # Stage-2 samples: the recorder stores the question as the prompt text the table shows.
    frame = samples_frame([{"step": 1, "split": "train", "prompt_text": question, "completion": "42", "reward": 1.0,
                            "v_star": 0.5, "advantage": 0.5, "implicit_reward": 0.1, "completion_length": 2}])
    assert list(frame.columns)[2] == "question" and frame["question"][0] == question


def test_header_shows_accuracy_before_and_after(store):
    run_id = store.create_run("demo", "train", {}, model="m", dataset="d")
    assert accuracy_change(store.get_evaluations(run_id)) == ""
    store.add_evaluation(run_id, 0, {"eval_accuracy": 0.0625, "eval_loss": 0.1})
    assert "<b>6%</b> before training" in accuracy_change(store.get_evaluations(run_id))
    store.add_evaluation(run_id, 10, {"eval_accuracy": 0.40})
    store.add_evaluation(run_id, 18, {"eval_accuracy": 0.5547})
    change = accuracy_change(store.get_evaluations(run_id))
    assert "<b>6% → 55%</b>" in change and "step 0 → step 18" in change
    assert "6% → 55%" in header(store.get_run(run_id), store.get_evaluations(run_id))


def test_flat_and_one_point_series_get_a_range_around_their_value():
    spec = charts.training_figure_spec({"learning_rate": ([1], [2e-5]), "loss": ([1, 2], [0.5, 0.25])})
    axes = {spec["layout"][f"yaxis{a}"].get("range") is not None for a in ("", "2")}
    lr_axis = next(v for k, v in spec["layout"].items() if k.startswith("yaxis") and v.get("tickformat"))
    assert lr_axis["range"] == pytest.approx([1e-5, 3e-5]) and axes == {True, False}
    lr_trace = next(t for t in spec["data"] if t["name"] == "learning_rate")
    assert lr_trace["marker"]["size"] > 4 and lr_trace["mode"] == "lines+markers"
    log = charts.training_figure_spec({"loss": ([1, 2, 3], [1.0, 0.1, 0.01]), "advantage": ([1, 2], [-0.5, 0.5])},
                                      smoothing=0.0, log_y=True)
    assert log["layout"]["yaxis"]["type"] == "log"  # loss: all positive
    assert "type" not in log["layout"]["yaxis2"]  # advantage has negative values: stays linear


def test_time_axis_maps_steps_to_minutes(store):
    run_id = store.create_run("t", "train", {}, model="m", dataset="d")
    for step in (1, 2, 4):
        store.add_metrics(run_id, step, {"loss": 0.5})
    with store._write() as s:  # the rows' times as a run 60 s a step would log them
        from sqlalchemy import update

        from storage.models import Metric
        for step, at in ((1, 1000.0), (2, 1060.0), (4, 1180.0)):
            s.execute(update(Metric).where(Metric.run_id == run_id, Metric.step == step).values(created_at=at))
    times = store.step_times(run_id)
    assert times == [(1, 1000.0), (2, 1060.0), (4, 1180.0)]
    moved = charts.time_axis({"loss": ([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1])}, times)
    assert moved["loss"][0] == pytest.approx([0.0, 1.0, 2.0, 3.0])
    view = training_view(store, run_id, store.last_ids(run_id), ChartOptions(0.0, "time", False), {})
    assert "minutes since the first step" in view["plot"].plot


def test_clone_of_a_run_passes_the_allow_list_and_a_tampered_one_does_not(tmp_path):
    policy = Policy(tmp_path)
    spec = RunSpec.from_dict(with_defaults({"name": "teach"})).to_dict()
    result = allowlist.check_spec({**spec, "name": "teach-clone"}, policy, offline=True)
    assert result.ok, result.message()
    form = forms.spec_to_form(result.spec)
    assert form["name"] == "teach-clone" and form["learning_rate"] == spec["config"]["learning_rate"]
    tampered = {**spec, "config": {**spec["config"], "trust_remote_code": True}}
    refused = allowlist.check_spec(tampered, policy, offline=True)
    assert not refused.ok and "trust_remote_code" in refused.message()


def test_chart_options_from_the_form():
    assert ChartOptions.of(None, None, None) == ChartOptions(0.6, "step", False)
    assert ChartOptions.of(0.3, "time", True) == ChartOptions(0.3, "time", True)
    assert ChartOptions.of(0.3, "weird", 0) == ChartOptions(0.3, "step", False)
    assert math.isclose(ChartOptions.of("0.5", "step", False).smoothing, 0.5)


def test_eval_accuracy_is_drawn_as_measured_and_beside_the_held_out_pass_rates(store):
    spec = charts.training_figure_spec({"eval_accuracy": ([0, 24], [0.0625, 0.59375])}, smoothing=0.6,
                                       ceilings={"pass@1": 0.02, "pass@N": 0.156})
    line = next(t for t in spec["data"] if t["name"] == "eval_accuracy")
    assert line["y"] == [0.0625, 0.59375]  # an evaluation is not smoothed toward its predecessors
    from app.web.pages.run.builders import eval_pass_rates

    vs = store.get_or_create_value_set("fp", {})
    run_id = store.create_run("r", "train", {}, model="m", dataset="d")
    rows = [{"prompt_id": f"{split}{i}", "prompt": "q", "prompt_text": "q", "v_star": 0.0, "rewards": [r, 0.0],
             "completions": ["a", "b"], "num_correct": int(r), "filtered": r == 0}
            for split, rs in (("train", [1.0, 1.0]), ("eval", [1.0, 0.0, 0.0, 0.0])) for i, r in enumerate(rs)]
    store.update_run(run_id, value_set_id=vs)
    for split in ("train", "eval"):
        store.add_values(vs, split, [r for r in rows if r["prompt_id"].startswith(split)])
        store.set_run_values(run_id, split, [r for r in rows if r["prompt_id"].startswith(split)])
    rates = eval_pass_rates(store, store.get_run(run_id), store.last_ids(run_id), store.get_value_set(vs))
    assert rates == {"pass@1": pytest.approx(1 / 8), "pass@N": pytest.approx(1 / 4)}  # the held-out prompts'


def test_the_runs_list_and_pickers_name_each_runs_method(tmp_path):
    from app.web.common import run_label
    from app.web.pages.runs import runs_frame

    store = Store(tmp_path / "studio.db")
    store.create_run("a", "train", {"name": "a"}, model="m", dataset="d")
    store.create_run("g", "train", {"name": "g", "method": "grpo"}, model="m", dataset="d")
    runs = sorted(store.list_runs(), key=lambda r: r["id"])
    assert list(runs_frame(runs)["action"]) == ["train · A*-PO", "train · GRPO"]
    assert [run_label(r) for r in runs] == ["#1 a (queued)", "#2 g (GRPO, queued)"]


def test_a_code_block_cannot_be_closed_by_the_text_it_shows():
    from app.web.common import code_block

    assert code_block("a + b") == "```text\na + b\n```"
    fenced = code_block("x\n```\n<img src=x>\n`````\ny")
    assert fenced.startswith("``````text\n") and fenced.endswith("\n``````")  # longer than the text's longest run
    assert code_block("~~~\n<b>", "") == "```\n~~~\n<b>\n```"  # tildes cannot close a fence of backticks


def test_stage_ones_bar_says_which_split_it_samples():
    from app.web.pages.run.header import stage_progress

    run = {"id": 1, "action": "train", "status": "running", "stage": "values", "progress": 0.15,
           "config": {"dataset": {"source": "arithmetic", "num_prompts": 256, "eval_size": 64}},
           "value_counts": {"train": 100}}
    assert "training prompts 100 / 256" in stage_progress(run, "train", None)
    run.update(progress=0.25, value_counts={"train": 256, "eval": 16})  # the held-out prompts, after the training ones
    bar = stage_progress(run, "train", None)
    assert "held-out prompts 16 / 64 (the 256 training prompts done)" in bar and "256 / 256" not in bar


def test_with_no_run_picked_stop_resume_and_delete_are_disabled(tmp_path):
    import gradio as gr

    from app.access.gate import Services
    from app.web.pages.run.page import build_run_page
    from app.web.pages.run.session import _no_run

    store = Store(tmp_path / "studio.db")
    with gr.Blocks() as demo:
        build_run_page(Services(store=store, scheduler=None, data_dir=tmp_path))
    buttons = {c.elem_id: c for c in demo.blocks.values() if c.elem_id in ("run-stop", "run-resume", "run-delete")}
    assert len(buttons) == 3 and all(b.interactive is False for b in buttons.values())  # as the page opens
    cleared = _no_run(store, "train")  # and once the picked run is cleared
    assert all(cleared[name].interactive is False for name in ("stop", "resume", "delete"))
