"""The Store's paged, aggregated and streamed reads (what the dashboard uses on big runs), on small hand-built
databases where every answer can be counted by hand, and the spreadsheet-safe CSV export."""

from __future__ import annotations

import csv
import io
import math

import pytest

from storage import Store, export_csv
from storage.views import _histogram_bins

SPEC = {"name": "q", "action": "train", "model": "tiny", "dataset": {"source": "arithmetic", "num_prompts": 8}}


def record(i: int, correct: int, n: int = 4, v_star: float | None = None, filtered: bool | None = None) -> dict:
    return {"prompt_id": f"p{i:02d}", "prompt": f"What is {i} + {i}?", "prompt_text": f"What is {i} + {i}?",
            "v_star": correct / n if v_star is None else v_star, "rewards": [1.0] * correct + [0.0] * (n - correct),
            "completions": [f"answer {j} of {i}" for j in range(n)], "num_correct": correct,
            "filtered": correct == 0 if filtered is None else filtered}


# Correct counts of 10 prompts (N = 4): 0 three times, 1 twice, 2 once, 4 four times.
CORRECT = [0, 1, 4, 0, 2, 4, 1, 4, 0, 4]


@pytest.fixture
def store(store_url) -> Store:
    return Store(store_url)  # a SQLite file, then a PostgreSQL database


def stage1(store: Store, run_id: int, value_set_id: int, split: str, records: list[dict]) -> None:
    """What the recorder writes for a stage-1 batch: the shared rows, then the run's own."""
    store.add_values(value_set_id, split, records)
    store.set_run_values(run_id, split, records)


@pytest.fixture
def values(store) -> int:
    """A run (its id) whose own V* rows are `CORRECT`'s prompts (train) and two eval prompts."""
    vs = store.get_or_create_value_set("fp", {})
    run_id = store.create_run("v", "train", SPEC)
    store.update_run(run_id, value_set_id=vs)
    stage1(store, run_id, vs, "train", [record(i, c) for i, c in enumerate(CORRECT)])
    stage1(store, run_id, vs, "eval", [record(50, 2), {"prompt_id": "given", "prompt": "x", "v_star": 0.9}])
    other = store.get_or_create_value_set("other", {})
    other_run = store.create_run("o", "train", SPEC)
    store.update_run(other_run, value_set_id=other)
    stage1(store, other_run, other, "train", [record(99, 4)])  # never counted with the first run
    return run_id


def test_value_stats_counts_histogram_bars_and_pass_rates(store, values):
    stats = store.value_stats(values, "train")
    assert stats["count"] == 10 and stats["filtered"] == 3 and stats["with_v_star"] == 10
    assert stats["num_samples"] == 4 and stats["sampled"] == 10
    assert stats["correct"] == [3, 2, 1, 0, 4]
    assert stats["mean_v_star"] == pytest.approx(sum(CORRECT) / 4 / 10)
    assert stats["pass_at_1"] == pytest.approx(sum(CORRECT) / 40)
    assert stats["pass_at_n"] == pytest.approx(0.7)
    assert (stats["min_v_star"], stats["max_v_star"]) == (0.0, 1.0)
    hist = stats["histogram"]
    assert sum(hist["kept"]) == 7 and sum(hist["filtered"]) == 3
    assert hist["filtered"][0] == 3  # V* = 0 falls in the first bin
    for v in (0.25, 0.5, 1.0):  # each V* value lands in the bin that holds it
        i = int((v - hist["start"]) / hist["width"])
        assert hist["start"] + i * hist["width"] <= v + 1e-12 < hist["start"] + (i + 1) * hist["width"]
    assert hist["kept"][int((1.0 - hist["start"]) / hist["width"])] == 4


def test_value_stats_of_given_values_and_empty_splits(store, values):
    stats = store.value_stats(values, "eval")
    assert stats["count"] == 2 and stats["sampled"] == 1 and stats["correct"] == [0, 0, 1, 0, 0]
    assert stats["pass_at_n"] == 1.0 and stats["mean_v_star"] == pytest.approx((0.5 + 0.9) / 2)
    empty = store.value_stats(values, "nothing")
    assert empty["count"] == 0 and empty["mean_v_star"] is None and empty["correct"] == []
    assert empty["histogram"]["kept"] == [] and empty["pass_at_1"] is None


@pytest.mark.parametrize("lo, hi", [(0.0, 1.0), (-3.2, 7.9), (0.5, 0.5), (-2.0, -2.0), (1e-4, 3e-4)])
def test_histogram_bins_cover_the_range_with_a_round_width(lo, hi):
    start, width, count = _histogram_bins(lo, hi, 30)
    assert start <= lo and hi < start + count * width and count <= 32
    mantissa = width / 10 ** math.floor(math.log10(width))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5, 10))


def test_values_page_sorts_filters_and_pages_without_wide_columns(store, values):
    page = store.values_page(values, "train", limit=4)
    assert [r["prompt_id"] for r in page] == ["p00", "p01", "p02", "p03"]  # stage-1 order
    assert set(page[0]) == {"id", "prompt_id", "prompt_text", "question", "v_star", "num_correct", "filtered"}
    assert [r["prompt_id"] for r in store.values_page(values, "train", offset=8, limit=4)] == ["p08", "p09"]
    by_v = store.values_page(values, "train", sort="v_star", descending=True, limit=10)
    assert [r["v_star"] for r in by_v] == sorted((c / 4 for c in CORRECT), reverse=True)
    assert [r["prompt_id"] for r in by_v[:4]] == ["p09", "p07", "p05", "p02"]  # ties: newest first
    by_correct = store.values_page(values, "train", sort="num_correct", limit=3)
    assert [r["prompt_id"] for r in by_correct] == ["p00", "p03", "p08"]
    assert [r["prompt_id"] for r in store.values_page(values, "train", filtered=True)] == ["p00", "p03", "p08"]
    assert len(store.values_page(values, "train", filtered=False)) == 7
    with pytest.raises(ValueError, match="Unknown sort"):
        store.values_page(values, "train", sort="completions")


def test_values_page_text_search_is_literal_and_case_insensitive(store, values):
    assert [r["prompt_id"] for r in store.values_page(values, "train", text="WHAT IS 7 +")] == ["p07"]
    assert [r["prompt_id"] for r in store.values_page(values, "train", text="p0")] == [f"p{i:02d}" for i in range(10)]
    assert store.values_page(values, "train", text="%") == []  # a wildcard is matched literally
    assert [r["prompt_id"] for r in store.values_page(values, "train", text="4 + 4", filtered=False)] == ["p04"]
    assert store.values_page(values, "train", text="What", text_chars=4)[0]["prompt_text"] == "What"


def test_one_prompt_and_rows_newer_than_an_id(store, values):
    row = store.get_value(values, "train", "p04")
    assert row["completions"] == [f"answer {j} of 4" for j in range(4)] and row["rewards"] == [1.0, 1.0, 0.0, 0.0]
    assert store.get_value(values, "eval", "p04") is None and store.get_value(values, "train", "nope") is None
    rows = store.values_after(values, "train")
    assert [r["prompt_id"] for r in rows] == [f"p{i:02d}" for i in range(10)] and "completions" not in rows[0]
    assert [r["prompt_id"] for r in store.values_after(values, "train", after_id=rows[6]["id"])] == ["p07", "p08",
                                                                                                    "p09"]
    stage1(store, values, store.get_run(values)["value_set_id"], "train", [record(10, 1)])
    assert [r["prompt_id"] for r in store.values_after(values, "train", after_id=rows[-1]["id"])] == ["p10"]
    assert [r["prompt_id"] for r in store.values_after(values, None, after_id=rows[-1]["id"])] == ["p50", "given",
                                                                                                  "p10"]
    assert len(store.values_after(values, "eval")) == 2 and len(store.values_after(values, "train", limit=2)) == 2


def test_metric_series_whole_and_downsampled(store):
    run_id = store.create_run("m", "train", SPEC)
    for step in range(1, 11):
        store.add_metrics(run_id, step, {"loss": 1.0 / step, "reward": step % 2})
    store.add_metrics(run_id, 5, {"loss": float("nan")})
    whole = store.metric_series(run_id, ["loss"], max_points=100)
    assert list(whole) == ["loss"] and whole["loss"]["step"] == list(range(1, 11))
    assert whole["loss"]["value"][4] is None and whole["loss"]["count"] == [1] * 10
    assert whole["loss"]["min"] == whole["loss"]["value"]

    small = store.metric_series(run_id, None, max_points=8)  # 4 buckets of width 3: steps 1-2, 3-5, 6-8, 9-10
    assert set(small) == {"loss", "reward"}
    reward = small["reward"]
    assert reward["step"] == [2, 5, 8, 10] and reward["count"] == [2, 3, 3, 2]
    assert reward["value"] == pytest.approx([0.5, 2 / 3, 1 / 3, 0.5])
    assert reward["min"] == [0, 0, 0, 0] and reward["max"] == [1, 1, 1, 1]
    assert small["loss"]["count"][1] == 3 and small["loss"]["value"][1] == pytest.approx((1 / 3 + 1 / 4) / 2)
    assert store.metric_series(run_id, ["missing"]) == {} and store.metric_series(999) == {}


def test_streamed_iteration_equals_the_whole_tables(store, values):
    run_id = store.create_run("s", "train", SPEC)
    store.add_samples(run_id, [{"step": s, "prompt_id": f"p{i}", "prompt_text": "x", "completion": str(i),
                                "reward": 1.0} for s in range(3) for i in range(7)])
    for step in range(5):
        store.add_metrics(run_id, step, {"loss": 1.0, "reward": 0.5})
    store.add_logs(run_id, [("INFO", f"line {i}") for i in range(9)])
    assert list(store.iter_samples(run_id, batch=4)) == store.get_samples(run_id, limit=None)
    assert list(store.iter_metrics(run_id, batch=3)) == store.get_metrics(run_id)
    assert list(store.iter_logs(run_id, batch=2)) == store.get_logs(run_id, limit=None)
    vs = store.get_run(values)["value_set_id"]
    assert list(store.iter_values(values, batch=3)) == store.get_values(vs, split=None)
    assert list(store.iter_values(values, "eval", batch=1)) == store.get_values(vs, "eval")
    assert list(store.iter_samples(999)) == []


def test_streamed_csv_export_equals_the_whole_table(store, values, tmp_path):
    path = tmp_path / "values.csv"
    assert export_csv(store.iter_values(values, batch=4), path) == 12
    assert path.read_text() == export_csv(store.get_values(store.get_run(values)["value_set_id"], split=None))
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert rows[0]["completions"] == '["answer 0 of 0", "answer 1 of 0", "answer 2 of 0", "answer 3 of 0"]'
    empty = tmp_path / "empty.csv"
    assert export_csv(iter([]), empty, columns=["a", "b"]) == 0 and empty.read_text() == '"a","b"\n'
    with pytest.raises(ValueError):
        export_csv([{"a": 1}, {"a": 2, "b": 3}], tmp_path / "bad.csv")


def test_csv_cells_that_a_spreadsheet_would_run_are_quoted():
    rows = [{"text": "=HYPERLINK(\"http://x\")", "plus": "+1", "minus": "-2+3", "at": "@SUM(A1)", "tab": "\tx",
             "cr": "\rx", "plain": "a=b", "number": -0.5, "int": -3, "none": None, "list": ["=1"]}]
    out = list(csv.DictReader(io.StringIO(export_csv(rows))))[0]
    assert out["text"] == "'=HYPERLINK(\"http://x\")" and out["plus"] == "'+1" and out["minus"] == "'-2+3"
    assert out["at"] == "'@SUM(A1)" and out["tab"] == "'\tx" and out["cr"] == "'\rx" and out["plain"] == "a=b"
    assert out["number"] == "-0.5" and out["int"] == "-3" and out["none"] == "" and out["list"] == '["=1"]'
    out = list(csv.DictReader(io.StringIO(export_csv([{"f": -1.5, "b": True, "e": ""}]))))[0]
    assert (out["f"], out["b"], out["e"]) == ("-1.5", "True", "")  # numbers, bools and empty text as they are


def test_csv_keeps_line_breaks_inside_a_cell(tmp_path):
    rows = [{"completion": "line 1\r\nline 2\rline 3\nend", "reward": 1.0}, {"completion": "x", "reward": None}]
    path = tmp_path / "multi.csv"
    export_csv(rows, path)
    with open(path, newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert [r["completion"] for r in back] == ["line 1\r\nline 2\rline 3\nend", "x"]
    assert back[0]["reward"] == "1.0" and back[1]["reward"] == ""
