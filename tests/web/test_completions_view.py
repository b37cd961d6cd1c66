"""The completions table without a browser: the store's sample queries (steps, one step's rows filtered and sorted, one
prompt across steps), the Run page's Samples view over every logged step (`app.web.pages.run.session.refresh`), and
Compare's two runs side by side at matched steps (`app.web.pages.completions.side_by_side`). Real SQLite file holding an
A*-PO run (one completion per prompt, every second step) and a GRPO run (G = 4, every third step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.access.gate import Services
from app.web import live
from app.web.pages import completions
from app.web.pages.run.frame import ChartOptions
from app.web.pages.run.session import new_state, refresh
from app.web.pages.run.views import OUTPUTS
from storage import Store
from tests.helpers import put_in

CHART = ChartOptions()
G = 4


def a2po_sample(step: int, i: int) -> dict:
    reward = float((step + i) % 3 == 0)
    return {"step": step, "split": "train", "prompt_id": f"p{i}", "sample_index": 0,
            "prompt_text": f"What is {i} + {i}?", "completion": f"a2po says {2 * i + step % 2} at {step}",
            "reward": reward, "v_star": None if i == 3 else i / 4, "advantage": reward - i / 4,
            "implicit_reward": 0.01 * i, "completion_length": 5 + i,
            "rewards": {"accuracy": reward}, "extra": {"judge": f"j{i}"}}


def grpo_sample(step: int, i: int, j: int) -> dict:
    return {"step": step, "split": "train", "prompt_id": f"p{i}", "sample_index": j,
            "prompt_text": f"What is {i} + {i}?", "completion": f"grpo try {j} at {step}",
            "reward": float(j % 2), "advantage": float(j % 2) - 0.5, "completion_length": 4 + j}


@pytest.fixture
def studio(tmp_path, monkeypatch):
    """(services, the A*-PO run's id, the GRPO run's id) on a real SQLite file; a clean shared cache."""
    monkeypatch.setattr(live, "SHARED", live.Shared())
    store = Store(tmp_path / "studio.db")
    a2po = store.create_run("astar", "train", {"name": "astar", "method": "a2po"}, model="tiny", dataset="arithmetic")
    grpo = store.create_run("group", "train", {"name": "group", "method": "grpo"}, model="tiny",
                            dataset="arithmetic")
    for run_id in (a2po, grpo):
        put_in(store, run_id, "finished", stage=None, started_at=1.0)
    for step in (2, 4, 6):
        store.add_samples(a2po, [a2po_sample(step, i) for i in range(4)])
    store.add_samples(a2po, [{**a2po_sample(6, 0), "split": "eval", "completion": "greedy 0"}])
    store.add_samples(grpo, [grpo_sample(3, i, j) for i in (0, 1) for j in range(G)])
    store.add_samples(grpo, [grpo_sample(6, i, j) for i in (2, 3) for j in range(G)])
    return Services(store=store, scheduler=None, data_dir=Path(tmp_path)), a2po, grpo


def samples_tab(services: Services, run_id: int, *, step=None, latest=True, correct="all", text="", sort="prompt",
                split="train", state=None) -> dict:
    """The Samples tab's outputs of one refresh, by name (the views that did not move: skipped)."""
    state = state or new_state(run_id, "samples")
    result = refresh(services, run_id, state, CHART, "train", "stage-1 order", "", correct, text, step, sort,
                         latest, split, tab="samples")
    return dict(zip(OUTPUTS, result, strict=True))


def test_the_store_reads_a_run_by_step_and_one_prompt_across_steps(studio):
    services, a2po, grpo = studio
    store = services.store
    assert store.sample_steps(a2po) == [2, 4, 6] and store.sample_steps(grpo) == [3, 6]
    assert store.sample_steps(a2po, "eval") == [6] and store.sample_splits(a2po) == ["eval", "train"]
    assert store.sample_steps(a2po, "nowhere") == [] and store.sample_splits(999) == []

    rows = store.step_samples(a2po, 4, sort="v_star", descending=True)
    assert [r["prompt_id"] for r in rows] == ["p2", "p1", "p0", "p3"]  # no V* (p3): last either way
    assert [r["prompt_id"] for r in store.step_samples(a2po, 4, sort="v_star")] == ["p0", "p1", "p2", "p3"]
    assert [r["prompt_id"] for r in store.step_samples(a2po, 4, correct=True)] == ["p2"]
    assert [r["prompt_id"] for r in store.step_samples(a2po, 4, text="3 + 3")] == ["p3"]
    assert rows[0]["extra"] == {"accuracy": 1.0, "judge": "j2"}
    with pytest.raises(ValueError, match="Unknown sample sort 'length': use one of prompt, reward"):
        store.step_samples(a2po, 4, sort="length")

    history = store.prompt_samples(grpo, "p1")
    assert [(r["step"], r["sample_index"]) for r in history] == [(3, j) for j in range(G)]
    assert [r["step"] for r in store.prompt_samples(a2po, "p1")] == [2, 4, 6]
    assert [r["step"] for r in store.prompt_samples(a2po, "p1", at_or_below=5)] == [4]
    assert store.prompt_samples(grpo, "p2", at_or_below=5) == []  # first sampled at step 6
    assert store.prompt_samples(a2po, "p0", "eval")[0]["completion"] == "greedy 0"


def test_the_samples_tab_reads_every_logged_step(studio):
    services, a2po, _ = studio
    shown = samples_tab(services, a2po)
    slider, table = shown["samples_step"], shown["samples"]
    assert (slider.minimum, slider.maximum, slider.step, slider.value) == (2, 6, 2, 6)  # the latest by default
    assert set(table["step"]) == {6} and list(table["prompt"]) == ["p0", "p1", "p2", "p3"]
    assert "Step **6** (the latest; 3 logged steps, 2 to 6): 4 completions" in shown["samples_info"]
    # The extra values (each reward's value, the log_extra columns) are columns of their own.
    assert list(table.columns[-2:]) == ["accuracy", "judge"] and list(table["judge"]) == ["j0", "j1", "j2", "j3"]

    for wanted, expected in ((4, 4), (5, 4), (2, 2), (0, 2), (99, 6)):  # a step without samples: the one before
        shown = samples_tab(services, a2po, step=wanted, latest=False)
        assert set(shown["samples"]["step"]) == {expected} and shown["samples_step"].value == expected, wanted
        assert shown["samples_latest"] is False
    completions_at = {step: list(samples_tab(services, a2po, step=step, latest=False)["samples"]["completion"])
                      for step in (2, 4)}
    assert completions_at[2] != completions_at[4] and completions_at[2][0] == "a2po says 0 at 2"

    by_reward = samples_tab(services, a2po, step=4, latest=False, sort="reward, highest first")["samples"]
    assert list(by_reward["reward"]) == [1.0, 0.0, 0.0, 0.0] and by_reward["prompt"][0] == "p2"
    by_advantage = samples_tab(services, a2po, step=4, latest=False, sort="advantage, lowest first")["samples"]
    assert list(by_advantage["advantage"]) == sorted(by_advantage["advantage"])
    wrong = samples_tab(services, a2po, step=6, latest=False, correct="incorrect", text="says")["samples"]
    assert list(wrong["prompt"]) == ["p1", "p2"]
    evals = samples_tab(services, a2po, split="eval")
    assert list(evals["samples"]["completion"]) == ["greedy 0"] and evals["samples_split"].choices == [
        ("eval", "eval"), ("train", "train")]


def test_following_the_latest_step_moves_with_a_live_run_and_a_picked_step_stays(studio):
    services, a2po, _ = studio
    following = new_state(a2po, "samples")
    samples_tab(services, a2po, state=following)
    picked = new_state(a2po, "samples")
    samples_tab(services, a2po, step=4, latest=False, state=picked)
    services.store.add_samples(a2po, [a2po_sample(8, i) for i in range(2)])
    live.forget_run(a2po)  # the shared snapshot is read at most once a second
    moved = samples_tab(services, a2po, state=following)
    assert set(moved["samples"]["step"]) == {8} and moved["samples_step"].maximum == 8
    stayed = samples_tab(services, a2po, step=4, latest=False, state=picked)
    assert set(stayed["samples"]["step"]) == {4} and stayed["samples_step"].maximum == 8


def test_one_prompt_across_steps_and_an_empty_run(studio):
    services, a2po, grpo = studio
    rows = services.store.prompt_samples(a2po, "p2")
    history = completions.history_frame(rows)
    assert list(history["step"]) == [2, 4, 6] and list(history["judge"]) == ["j2"] * 3
    assert "sampled at 3 step(s), 2 to 6" in completions.prompt_heading(rows, "p2")
    assert "What is 2 + 2?" in completions.prompt_heading(rows, "p2")
    # A GRPO step by prompt: a prompt's G completions together, in index order; by reward: in the sort's order.
    table = completions.samples_frame(services.store.step_samples(grpo, 3))
    assert list(zip(table["prompt"], table["#"], strict=True)) == [(f"p{i}", j) for i in (0, 1) for j in range(G)]
    table = completions.samples_frame(services.store.step_samples(grpo, 3, sort="reward", descending=True))
    assert list(table["reward"]) == [1.0] * G + [0.0] * G and list(table["#"][:2]) == [1, 3]

    empty = services.store.create_run("empty", "train", {"name": "empty"})
    shown = samples_tab(services, empty)
    assert shown["samples"].empty and "No completions logged yet" in shown["samples_info"]
    assert shown["samples_step"].interactive is False


def test_compare_sets_two_runs_side_by_side_at_matched_steps(studio):
    services, a2po, grpo = studio
    runs = [services.store.get_run(i) for i in (grpo, a2po)]
    assert completions.default_pair(runs) == (a2po, grpo)  # A*-PO left, GRPO right, whatever the order picked

    shown = completions.side_by_side(services.store, [a2po, grpo], 5, "p1")
    assert shown["steps"] == [2, 3, 4, 6] and shown["step"] == 4 and shown["prompt"] == "p1"
    (left_head, left), (right_head, right) = shown["sides"]
    assert "\\#1 astar (A\\*-PO)" in left_head and "step 4 · 1 completion" in left_head
    assert list(left["completion"]) == ["a2po says 2 at 4"]
    assert "(GRPO)" in right_head and "step 3 (its latest at or before 4) · 4 completions" in right_head
    assert list(right["completion"]) == [f"grpo try {j} at 3" for j in range(G)]
    assert shown["text"] == "What is 1 + 1?"
    # The prompts both runs sampled at their matched steps come first.
    assert [value for _, value in shown["choices"]][:2] == ["p0", "p1"]

    latest = completions.side_by_side(services.store, [a2po, grpo], None, None)
    assert latest["step"] == 6 and latest["prompt"] == "p2"  # the first prompt both sampled at step 6
    assert all(len(frame) for _, frame in latest["sides"])
    early = completions.side_by_side(services.store, [a2po, grpo], 2, "p2")
    assert "no completion of this prompt at or before step 2; first at step 6" in early["sides"][1][0]
    assert completions.side_by_side(services.store, [None, None], None, None)["sides"] == []
