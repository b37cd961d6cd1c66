"""Unit tests of the dashboard's Plotly figure builders (pure functions, no server)."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from app.web import charts


def test_ema_zero_smoothing_is_identity():
    assert charts.ema([1.0, 5.0, 2.0], 0.0) == [1.0, 5.0, 2.0]


def test_ema_is_debiased_and_matches_recurrence():
    values = [1.0, 2.0, 3.0, 4.0]
    w = 0.5
    out = charts.ema(values, w)
    # Debiased: the first point equals the first value, not (1 - w) * value.
    assert out[0] == pytest.approx(1.0)
    last, weight, expected = 0.0, 0.0, []
    for v in values:
        last = w * last + (1 - w) * v
        weight = w * weight + (1 - w)
        expected.append(last / weight)
    assert out == pytest.approx(expected)
    assert out[1] == pytest.approx((0.25 * 1 + 0.5 * 2) / 0.75)


def test_ema_constant_series_stays_constant_and_skips_gaps():
    out = charts.ema([3.0, None, 3.0, math.nan, 3.0], 0.9)
    assert out == pytest.approx([3.0] * 5)
    assert math.isnan(charts.ema([None, 1.0], 0.5)[0])
    with pytest.raises(ValueError):
        charts.ema([1.0], 1.0)


def test_downsample_keeps_short_series_and_extremes_of_long_ones():
    xs, ys = charts.downsample([0, 1, 2], [5.0, 6.0, 7.0], 10)
    assert (xs, ys) == ([0, 1, 2], [5.0, 6.0, 7.0])

    n = 10_000
    x = list(range(n))
    y = np.sin(np.arange(n) / 50).tolist()
    y[4321] = 100.0  # a spike that plain striding would likely drop
    y[7777] = -100.0
    dx, dy = charts.downsample(x, y, 500)
    assert len(dx) <= 502
    assert dx[0] == 0 and dx[-1] == n - 1
    assert 100.0 in dy and -100.0 in dy
    assert dx == sorted(dx)


def test_series_from_rows_groups_and_appends():
    rows = [{"step": 1, "name": "loss", "value": 0.5}, {"step": 1, "name": "reward", "value": None},
            {"step": 2, "name": "loss", "value": 0.4}]
    series = charts.series_from_rows(rows)
    assert series["loss"] == ([1, 2], [0.5, 0.4])
    assert math.isnan(series["reward"][1][0])
    charts.series_from_rows([{"step": 3, "name": "loss", "value": 0.3}], into=series)
    assert series["loss"] == ([1, 2, 3], [0.5, 0.4, 0.3])


def _names(figure):
    return [t.name for t in figure.data] if hasattr(figure, "data") else [t["name"] for t in figure["data"]]


def _valid(spec: dict) -> dict:
    """`spec` after Plotly has checked every property in it (a typo in a `*_spec` builder raises here)."""
    go.Figure(spec)
    return spec


def test_training_figure_has_raw_and_smoothed_traces_per_metric():
    series = {"loss": ([1, 2, 3], [1.0, 0.5, 0.2]), "reward": ([1, 2, 3], [0.0, 0.5, 1.0]),
              "unrelated": ([1], [1.0])}
    spec = _valid(charts.training_figure_spec(series, smoothing=0.5))
    assert _names(spec) == ["loss (raw)", "loss", "reward (raw)", "reward"]
    raw = spec["data"][0]
    assert raw["opacity"] == charts.RAW_OPACITY
    assert spec["data"][1]["y"] == pytest.approx(charts.ema([1.0, 0.5, 0.2], 0.5))
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert "Loss" in titles and "Reward" in titles

    no_smoothing = charts.training_figure_spec(series, smoothing=0.0)
    assert _names(no_smoothing) == ["loss", "reward"]


def test_nonfinite_losses_get_a_panel_only_when_there_are_some():
    healthy = {"loss": ([1, 2], [1.0, 0.5]), "frac_nonfinite_loss": ([1, 2], [0.0, 0.0])}
    assert _names(charts.training_figure_spec(healthy, smoothing=0.0)) == ["loss"]
    broken = {"loss": ([1, 2], [1.0, 0.5]), "frac_nonfinite_loss": ([1, 2], [0.0, 1.0])}
    spec = _valid(charts.training_figure_spec(broken, smoothing=0.5))
    assert _names(spec) == ["loss (raw)", "loss", "frac_nonfinite_loss"]
    assert spec["data"][-1]["y"] == [0.0, 1.0]
    assert "Non-finite loss (share of the step)" in [a["text"] for a in spec["layout"]["annotations"]]


def test_training_figure_downsamples_long_series():
    n = 20_000
    spec = charts.training_figure_spec({"loss": (list(range(n)), np.random.default_rng(0).random(n).tolist())},
                                       smoothing=0.9, max_points=400)
    assert all(len(t["x"]) <= 402 for t in spec["data"])


def test_training_figure_draws_reference_ceilings_on_eval_accuracy():
    spec = _valid(charts.training_figure_spec({"eval_accuracy": ([0, 10], [0.1, 0.3])}, smoothing=0.0,
                                              ceilings={"pass@1": 0.25, "pass@N": 0.75}))
    levels = sorted(shape["y0"] for shape in spec["layout"]["shapes"])
    assert levels == [0.25, 0.75]


def test_training_figure_empty_shows_message():
    spec = _valid(charts.training_figure_spec({}))
    assert not spec["data"]
    assert "Waiting" in spec["layout"]["annotations"][0]["text"]


def test_value_histogram_separates_filtered_prompts():
    # V* 0.0, 0.3, 0.9, 0.0 with both zeros filtered, binned in SQL as [0, 0.5) and [0.5, 1).
    spec = _valid(charts.binned_value_histogram_spec(0.0, 0.5, kept=[1, 1], filtered=[2, 0]))
    assert _names(spec) == ["kept (2)", "filtered (2)"]
    assert spec["data"][0]["x"] == [0.25, 0.75] and spec["data"][0]["y"] == [1, 1]
    assert spec["layout"]["barmode"] == "stack"
    assert _names(charts.binned_value_histogram_spec(0.0, 1.0, kept=[1], filtered=[0])) == ["kept (1)"]
    assert not charts.binned_value_histogram_spec(0.0, 1.0, kept=[0], filtered=[0])["data"]


def test_correct_count_bar_counts_prompts_per_k():
    spec = _valid(charts.counted_correct_bar_spec([2, 0, 1, 0, 3]))
    assert spec["data"][0]["x"] == [0, 1, 2, 3, 4]
    assert spec["data"][0]["y"] == [2, 0, 1, 0, 3]
    assert spec["layout"]["title"]["text"] == "Correct reference samples (out of N=4)"
    assert not charts.counted_correct_bar_spec([0, 0, 0])["data"]


def test_pass_rate_figure_marks_pass_at_n_as_what_stage_1_keeps():
    spec = _valid(charts.pass_rate_spec(0.25, 0.75, 8, eval_accuracy=0.5))
    assert spec["data"][0]["x"] == [0.25, 0.75, 0.5]
    assert spec["data"][0]["y"][1] == "reference pass@8 (kept for training)"  # not a ceiling: the policy can pass it
    assert spec["layout"]["shapes"][0]["x0"] == 0.75


def test_compare_figure_overlays_runs_with_one_legend_entry_each():
    runs = {"run-a": {"loss": ([1, 2], [1.0, 0.5])}, "run-b": {"loss": ([1, 2], [0.8, 0.6]),
                                                                "reward": ([1, 2], [0.1, 0.2])}}
    fig = charts.compare_figure(runs, ["loss", "reward", "missing"], smoothing=0.0)
    assert _names(fig) == ["run-a", "run-b", "run-b"]
    assert [t.showlegend for t in fig.data] == [True, True, False]
    assert fig.data[0].line.color != fig.data[1].line.color
    assert not charts.compare_figure({}, ["loss"]).data


def test_a_legend_below_the_plot_gets_the_room_its_rows_take():
    """Plotly squeezes the plot to fit a legend taller than the room left for it, and lays its first names over the
    axis's title: the figure grows by the legend's rows instead, a row per entry for runs' long names."""
    def figure(names: list[str]) -> go.Figure:
        fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], name=n) for n in names])
        charts.legend_below(fig, plot_px=190)
        return fig

    long = figure([f"#{i} recipe-search-duel-time-4min-a2po-s{i} (A*-PO) with stage 1" for i in range(8)])
    short = figure([f"run {i}" for i in range(8)])
    for fig in (long, short):
        legend, margin = fig.layout.legend, fig.layout.margin
        assert (legend.yref, legend.yanchor, legend.y) == ("container", "bottom", 0)  # at the figure's foot
        assert fig.layout.height - margin.t - margin.b == 190  # the plot keeps its height
        assert legend.maxheight >= margin.b - 60  # no scroll bar inside the room it has
    rows = (long.layout.margin.b - 60 - 10) / 21
    assert rows == 8 and short.layout.margin.b < long.layout.margin.b
