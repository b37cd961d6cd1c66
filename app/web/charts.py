"""Plotly figure builders for the dashboard: pure functions from lists and dicts to figure specs or `go.Figure`.

Nothing here touches the database or Gradio, so every builder is unit-testable. The charts a live Run page redraws
(training grid, V* histogram, correct-count bars, pass rates) are built as plain dicts (`*_spec`) that `to_json`
serialises directly: building and checking a Plotly object cost the training grid more time than the queries
behind it. Long series are downsampled (`downsample`) before drawing so a chart stays responsive with many
thousands of logged steps, and training curves are drawn twice: the raw values faint, the exponential moving
average (`ema`) on top.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

Series = tuple[list[float], list[float]]
"""(steps, values) of one metric."""

PALETTE = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff",
           "#fecb52"]
TRAINING_METRICS: list[tuple[str, str]] = [
    ("loss", "Loss"),
    ("reward", "Reward"),
    ("advantage", "Advantage r − V*"),
    ("implicit_reward", "Implicit reward β₂·log π/π_ref"),
    ("log_ratio", "KL (log ratio)"),
    ("completion_length", "Completion length"),
    ("learning_rate", "Learning rate"),
    ("eval_accuracy", "Eval accuracy"),
    ("frac_nonfinite_loss", "Non-finite loss (share of the step)"),
]
# What the trainers (and transformers' Trainer) log themselves: any other metric of a run was logged by one of its
# reward functions (`log_metric`, TRL's reward contract) and gets a panel after the built-in ones
# (`reward_metric_panels`). tests/a2po/test_reward_contract.py checks that both trainers log nothing else.
OWN_METRICS = {"loss", "grad_norm", "learning_rate", "epoch", "reward", "reward_std", "accuracy", "completion_length",
               "completion_clipped_frac", "v_star", "advantage", "implicit_reward", "log_ratio", "kl", "entropy",
               "frac_nonfinite_loss", "frac_reward_zero_std", "completion_tokens", "eval_seconds", "step_seconds",
               "peak_memory_gb", "total_flos", "compute_flops", "cispo_clip_ratio"}
OWN_METRIC_PREFIXES = ("eval_", "values/", "rewards/", "clip_ratio/", "sampling/", "vespo/", "train_")
# A schedule, evaluations (a few exact points each on the same prompts) and a failure count: drawn as they are.
UNSMOOTHED = {"learning_rate", "eval_accuracy", "frac_nonfinite_loss"}
# Panels drawn only once a value is not 0: a healthy run logs 0 at every step, which is not worth a panel.
ONLY_WHEN_NONZERO = {"frac_nonfinite_loss"}
MAX_POINTS = 1000
RAW_OPACITY = 0.25


def ema(values: Sequence[float | None], smoothing: float, counts: Sequence[int] | None = None) -> list[float]:
    """Debiased exponential moving average (as TensorBoard draws it).

    `smoothing` in [0, 1): 0 returns the values unchanged, 0.9 averages over roughly the last ten points.
    Missing values (None, NaN) are carried over from the previous smoothed point (NaN before the first value).
    `counts` (for a series downsampled into bucket means, see `Store.metric_series`): a value standing for k rows
    is applied as k updates, so the smoothing keeps its span in steps (exact when a bucket's rows are equal).
    """
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    out: list[float] = []
    last, weight = 0.0, 0.0
    for i, value in enumerate(values):
        if value is None or math.isnan(value):
            out.append(last / weight if weight else math.nan)
            continue
        keep = smoothing ** (counts[i] if counts is not None else 1)
        last = keep * last + (1 - keep) * value
        weight = keep * weight + (1 - keep)
        out.append(last / weight)
    return out


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> Series:
    """Reduce a series to at most about `max_points` points, keeping each bucket's minimum and maximum.

    Keeping both extremes (in x order) preserves spikes that plain striding would drop; the first and last points
    are always kept. Series already short enough come back unchanged (as lists).
    """
    n = len(xs)
    if n <= max_points or max_points < 4:
        return list(xs), list(ys)
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    buckets = np.array_split(np.arange(1, n - 1), max(1, (max_points - 2) // 2))
    keep = [0]
    for idx in buckets:
        if len(idx) == 0:
            continue
        finite = idx[np.isfinite(y[idx])]
        if len(finite) == 0:
            keep.append(int(idx[0]))
            continue
        lo, hi = int(finite[np.argmin(y[finite])]), int(finite[np.argmax(y[finite])])
        keep.extend(sorted({lo, hi}))
    keep.append(n - 1)
    return x[keep].tolist(), y[keep].tolist()


def series_from_rows(rows: Iterable[Mapping], into: dict[str, Series] | None = None) -> dict[str, Series]:
    """Group metric rows (`step`, `name`, `value`) into per-name series, appending to `into` when given."""
    out: dict[str, Series] = into if into is not None else {}
    for row in rows:
        steps, values = out.setdefault(row["name"], ([], []))
        steps.append(row["step"])
        values.append(math.nan if row["value"] is None else float(row["value"]))
    return out


def empty_spec(message: str, height: int = 260) -> dict:
    """A blank figure that shows `message` in its middle (for charts with nothing to draw yet)."""
    return {"data": [], "layout": {
        "template": _template(), "height": height, "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "margin": {"l": 20, "r": 20, "t": 30, "b": 20},
        "annotations": [{"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
                         "font": {"size": 14, "color": "#888"}}]}}


def empty_figure(message: str, height: int = 260) -> go.Figure:
    return go.Figure(empty_spec(message, height))


@functools.cache
def _template() -> dict:
    return pio.templates["plotly_white"].to_plotly_json()


def to_json(spec: Mapping) -> str:
    """A figure spec (the `*_spec` builders) as the JSON Plotly.js draws: what `go.Figure(spec).to_json()` gives,
    without building and checking a Plotly object (much faster for the training grid)."""
    return json.dumps(spec, separators=(",", ":"), allow_nan=False)


def _plain(values: Iterable[float | None]) -> list[float | None]:
    """Floats for JSON: NaN and None as null (Plotly draws a gap)."""
    return [None if v is None or v != v else float(v) for v in values]


def _curve_traces(steps: Sequence[float], values: Sequence[float], *, name: str, color: str, smoothing: float,
                  max_points: int, legendgroup: str | None = None, showlegend: bool = True,
                  buckets: Mapping | None = None) -> list[dict]:
    """Raw line (faint) plus its EMA; both downsampled after smoothing so the smoothing sees every point.

    `buckets` (`count`, `min`, `max` per point, from `Store.metric_series`): the points are bucket means; the raw
    line then runs through each bucket's extremes and the EMA weighs each mean by its row count."""
    group = {"legendgroup": legendgroup} if legendgroup is not None else {}
    counts = buckets.get("count") if buckets else None
    smooth = ema(values, smoothing, counts) if smoothing > 0 else list(values)
    traces = []
    if smoothing > 0:
        rx, ry = _extremes(steps, buckets) if buckets else (steps, values)
        rx, ry = downsample(rx, ry, max_points)
        traces.append({"type": "scatter", "x": _plain(rx), "y": _plain(ry), "mode": "lines", "name": f"{name} (raw)",
                       "line": {"color": color, "width": 1}, "opacity": RAW_OPACITY, "hoverinfo": "skip",
                       "showlegend": False, **group})
    sx, sy = downsample(steps, smooth, max_points)
    traces.append({"type": "scatter", "x": _plain(sx), "y": _plain(sy), "mode": "lines+markers" if len(sx) <= 30
                   else "lines", "name": name, "line": {"color": color, "width": 2},
                   "marker": {"size": 9 if len(sx) == 1 else 4},  # one point alone is a dot a reader can see
                   "showlegend": showlegend, **group})
    return traces


def _add_curve(fig: go.Figure, steps: Sequence[float], values: Sequence[float], *, row: int, col: int,
               **kwargs) -> None:
    for trace in _curve_traces(steps, values, **kwargs):
        trace = {k: v for k, v in trace.items() if k != "type"}
        trace["x"], trace["y"] = (np.array(trace[k], dtype=float) for k in ("x", "y"))  # checked at once
        fig.add_trace(go.Scatter(**trace), row=row, col=col)


def _extremes(steps: Sequence[float], buckets: Mapping) -> Series:
    """The raw line of a bucketed series: through each bucket's minimum and maximum (None: NaN)."""
    xs: list[float] = []
    ys: list[float] = []
    for step, lo, hi in zip(steps, buckets["min"], buckets["max"], strict=True):
        lo, hi = (math.nan if v is None else float(v) for v in (lo, hi))
        xs.extend((step, step) if lo != hi else (step,))
        ys.extend((lo, hi) if lo != hi else (lo,))
    return xs, ys


def bucketed_series(data: Mapping[str, Mapping[str, Sequence]]) -> tuple[dict[str, Series], dict[str, Mapping]]:
    """`Store.metric_series` output as (series for `training_figure_spec`, its `buckets` argument)."""
    series = {name: (list(d["step"]), [math.nan if v is None else float(v) for v in d["value"]])
              for name, d in data.items()}
    return series, {name: d for name, d in data.items() if any(c > 1 for c in d["count"])}


def time_axis(series: Mapping[str, Series], step_times: Sequence[tuple[int, float]]) -> dict[str, Series]:
    """`series` with each step replaced by the minutes since the first logged step, read off `step_times`
    ((step, unix time) pairs, see `Store.step_times`) and interpolated between them."""
    if not step_times:
        return dict(series)
    return _step_axis(series, [(s, (t - step_times[0][1]) / 60.0) for s, t in step_times], 3)


def compute_axis(series: Mapping[str, Series], step_compute: Sequence[tuple[int, float]]) -> dict[str, Series]:
    """`series` with each step replaced by the run's compute in TFLOP (stage 1 included), read off `step_compute`
    ((step, FLOPs) pairs: its `compute_flops` metric) and interpolated between them."""
    if not step_compute:
        return dict(series)
    return _step_axis(series, [(s, flops / 1e12) for s, flops in step_compute], 4)


def _step_axis(series: Mapping[str, Series], known: Sequence[tuple[int, float]], digits: int) -> dict[str, Series]:
    known_steps = np.asarray([s for s, _ in known], dtype=float)
    at = np.asarray([v for _, v in known], dtype=float)
    return {name: (np.interp(np.asarray(steps, dtype=float), known_steps, at).round(digits).tolist(), list(values))
            for name, (steps, values) in series.items()}


def _flat_range(values: Sequence[float], log: bool) -> list[float] | None:
    """A y range for a series whose finite values are all one number (a single point, a constant learning rate):
    Plotly's own range for it is -1..1 around nothing, which drew a learning rate of 2e-5 at 0."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite or min(finite) != max(finite):
        return None
    v = finite[0]
    if log:
        return [math.log10(v) - 0.5, math.log10(v) + 0.5] if v > 0 else None
    pad = abs(v) * 0.5 if v else 1.0
    return [v - pad, v + pad]


def reward_metric_panels(names: Iterable[str]) -> list[tuple[str, str]]:
    """(name, title) of each metric in `names` that a reward function logged (see `OWN_METRICS`), by name."""
    return [(name, name) for name in sorted(names)
            if name not in OWN_METRICS and not name.startswith(OWN_METRIC_PREFIXES)]


def training_figure_spec(series: Mapping[str, Series], smoothing: float = 0.6, max_points: int = MAX_POINTS,
                         ceilings: Mapping[str, float] | None = None,
                         metrics: Sequence[tuple[str, str]] = TRAINING_METRICS,
                         buckets: Mapping[str, Mapping] | None = None, x_title: str = "step",
                         log_y: bool = False) -> dict:
    """Grid of training curves, one panel per metric in `metrics` that has data, two panels a row.

    `x_title` names the x values of `series` (steps, or minutes from `time_axis`); `log_y` draws every panel whose
    values are all positive on a log scale (a loss spanning decades); a flat series gets a range around its value.

    `ceilings` ({"pass@1": 0.4, "pass@N": 0.8}) are drawn as dashed horizontal lines on the eval accuracy panel:
    the reference policy's pass rates on the held-out prompts, to compare with (not a bound: pass@N is the share of
    prompts stage 1 can train on, and a trained policy can solve prompts none of its reference samples solved).
    `buckets` ({name: {"count", "min", "max"}}):
    series that are bucket means of a downsampled run (see `bucketed_series`).
    """
    present = [(key, title) for key, title in metrics if series.get(key) and len(series[key][0])
               and (key not in ONLY_WHEN_NONZERO or any(v != 0 for v in series[key][1]))]
    if not present:
        return empty_spec("Waiting for the first logged training step…")
    cols, rows = 2, math.ceil(len(present) / 2)
    gap_x, gap_y = 0.08, min(0.12, 0.5 / rows)
    width, height = (1 - gap_x * (cols - 1)) / cols, (1 - gap_y * (rows - 1)) / rows
    data: list[dict] = []
    layout: dict = {"annotations": [], "shapes": []}
    for i, (key, title) in enumerate(present):
        row, col = divmod(i, cols)
        x0, top = col * (width + gap_x), 1 - row * (height + gap_y)
        axis = "" if i == 0 else str(i + 1)
        steps, values = series[key]
        log = log_y and all(v > 0 for v in values if v is not None and math.isfinite(v))
        flat = _flat_range(values, log)
        layout[f"xaxis{axis}"] = {"domain": [x0, x0 + width], "anchor": f"y{axis}",
                                  "title": {"text": x_title, "font": {"size": 10}, "standoff": 2}}
        layout[f"yaxis{axis}"] = {"domain": [top - height, top], "anchor": f"x{axis}",
                                  **({"tickformat": ".2~e"} if key == "learning_rate" else {}),
                                  **({"type": "log"} if log else {}), **({"range": flat} if flat else {})}
        layout["annotations"].append({"text": title, "x": x0 + width / 2, "y": top, "xref": "paper", "yref": "paper",
                                      "xanchor": "center", "yanchor": "bottom", "showarrow": False,
                                      "font": {"size": 16}})
        for trace in _curve_traces(steps, values, name=key, color=PALETTE[i % len(PALETTE)],
                                   smoothing=0.0 if key in UNSMOOTHED else smoothing, max_points=max_points,
                                   showlegend=False, buckets=(buckets or {}).get(key)):
            data.append({**trace, "xaxis": f"x{axis}", "yaxis": f"y{axis}"})
        if key == "eval_accuracy" and ceilings:
            for j, (label, level) in enumerate(ceilings.items()):
                if level is None or not math.isfinite(level):
                    continue
                layout["shapes"].append({"type": "line", "xref": f"x{axis} domain", "x0": 0, "x1": 1,
                                         "yref": f"y{axis}", "y0": level, "y1": level,
                                         "line": {"dash": "dash", "color": "#999", "width": 1}})
                layout["annotations"].append({"text": f"reference {label} {level:.2f}", "showarrow": False,
                                              "xref": f"x{axis} domain", "x": 0, "xanchor": "left",
                                              "yref": f"y{axis}", "y": level, "yanchor": "bottom" if j else "top",
                                              "font": {"size": 10, "color": "#666"}})
    layout.update(template=_template(), height=240 * rows + 40, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                  uirevision="training", hovermode="x unified", showlegend=False)
    return {"data": data, "layout": layout}


def binned_value_histogram_spec(start: float, width: float, kept: Sequence[int], filtered: Sequence[int]) -> dict:
    """The V* histogram from counts binned in SQL (`Store.value_stats`): bin i spans start + i * width onward;
    filtered prompts stacked in grey."""
    if not sum(kept) + sum(filtered):
        return empty_spec("No V* estimates yet")
    centers = [start + (i + 0.5) * width for i in range(len(kept))]
    edges = [f"{start + i * width:.4g} to {start + (i + 1) * width:.4g}" for i in range(len(kept))]
    bar = {"type": "bar", "x": centers, "width": width, "customdata": edges,
           "hovertemplate": "V* %{customdata}: %{y} prompts<extra></extra>"}
    data = [{**bar, "y": [int(k) for k in kept], "name": f"kept ({sum(kept)})", "marker": {"color": PALETTE[0]}}]
    if sum(filtered):
        data.append({**bar, "y": [int(k) for k in filtered], "name": f"filtered ({sum(filtered)})",
                     "marker": {"color": "#bbbbbb"}})
    return {"data": data, "layout": {
        "template": _template(), "barmode": "stack", "bargap": 0, "height": 300, "title": {"text": "V* over prompts"},
        "xaxis": {"title": {"text": "V*(x)"}}, "yaxis": {"title": {"text": "prompts"}},
        "margin": {"l": 50, "r": 20, "t": 50, "b": 40},
        "legend": {"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right"}}}


def counted_correct_bar_spec(counts: Sequence[int]) -> dict:
    """How many prompts had k correct reference samples out of N, for k = 0..N (k = 0 in grey): `counts[k]`."""
    if not sum(counts):
        return empty_spec("No reference samples yet")
    n = len(counts) - 1
    return {"data": [{"type": "bar", "x": list(range(n + 1)), "y": [int(c) for c in counts], "name": "prompts",
                      "marker": {"color": ["#bbbbbb"] + [PALETTE[2]] * n},
                      "hovertemplate": "%{x} of " + str(n) + " correct: %{y} prompts<extra></extra>"}],
            "layout": {"template": _template(), "height": 300,
                       "title": {"text": f"Correct reference samples (out of N={n})"},
                       "xaxis": {"title": {"text": "correct samples"}, "dtick": 1},
                       "yaxis": {"title": {"text": "prompts"}}, "margin": {"l": 50, "r": 20, "t": 50, "b": 40}}}


def pass_rate_band_spec(counts: Sequence[int], band: Sequence[float]) -> dict:
    """How many prompts had each reference pass rate p = k / N (`counts[k]`, k = 0..N), the pass-rate band
    [low, high] shaded: bars inside it are the prompts training keeps, the others grey."""
    if not sum(counts):
        return empty_spec("No reference samples yet")
    n = len(counts) - 1
    low, high = float(band[0]), float(band[1])
    inside = [low - 1e-9 <= k / n <= high + 1e-9 for k in range(n + 1)]
    kept = sum(c for c, keep in zip(counts, inside) if keep)
    return {"data": [{"type": "bar", "x": [k / n for k in range(n + 1)], "y": [int(c) for c in counts],
                      "width": 0.8 / n, "name": "prompts", "customdata": list(range(n + 1)),
                      "marker": {"color": [PALETTE[2] if keep else "#bbbbbb" for keep in inside]},
                      "hovertemplate": "p = %{customdata}/" + str(n) + ": %{y} prompts<extra></extra>"}],
            "layout": {"template": _template(), "height": 300,
                       "title": {"text": f"Reference pass rate, band [{low:g}, {high:g}]: {kept} prompts in it"},
                       "xaxis": {"title": {"text": f"pass rate p (correct of N={n})"},
                                 "range": [-0.6 / n, 1 + 0.6 / n]},
                       "yaxis": {"title": {"text": "prompts"}}, "margin": {"l": 50, "r": 20, "t": 50, "b": 40},
                       "shapes": [{"type": "rect", "xref": "x", "yref": "paper", "x0": low - 0.5 / n,
                                   "x1": high + 0.5 / n, "y0": 0, "y1": 1, "fillcolor": PALETTE[2], "opacity": 0.12,
                                   "line": {"width": 0}, "layer": "below"}]}}


def pass_rate_spec(pass_at_1: float, pass_at_n: float, num_samples: int,
                   eval_accuracy: float | None = None) -> dict:
    """Reference pass@1 and pass@N as bars, plus the best eval accuracy. pass@N is the share of prompts stage 1 keeps
    for training (one correct sample of N is enough), not a bound on what the trained policy reaches."""
    labels = ["reference pass@1", f"reference pass@{num_samples} (kept for training)"]
    values = [pass_at_1, pass_at_n]
    colors = [PALETTE[0], "#999999"]
    if eval_accuracy is not None:
        labels.append("trained policy (best eval)")
        values.append(eval_accuracy)
        colors.append(PALETTE[2])
    return {"data": [{"type": "bar", "x": _plain(values), "y": labels, "orientation": "h",
                      "marker": {"color": colors}, "textposition": "auto",
                      "text": [f"{v:.1%}" if v is not None and math.isfinite(v) else "–" for v in values]}],
            "layout": {"template": _template(), "height": 220, "title": {"text": "Pass rates"},
                       "xaxis": {"range": [0, 1.02], "tickformat": ".0%"},
                       "margin": {"l": 200, "r": 20, "t": 50, "b": 30},
                       "shapes": [{"type": "line", "xref": "x", "x0": pass_at_n, "x1": pass_at_n, "yref": "y domain",
                                   "y0": 0, "y1": 1, "line": {"dash": "dash", "color": "#666"}}]}}


def compare_figure(runs: Mapping[str, Mapping[str, Series]], metrics: Sequence[str], smoothing: float = 0.6,
                   max_points: int = MAX_POINTS) -> go.Figure:
    """Overlay the same metrics of several runs: one panel per metric, one color per run."""
    metrics = [m for m in metrics if any(m in s and len(s[m][0]) for s in runs.values())]
    if not runs or not metrics:
        return empty_figure("Pick runs and metrics to compare")
    cols = 1 if len(metrics) == 1 else 2
    rows = math.ceil(len(metrics) / cols)
    titles = dict(TRAINING_METRICS)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[titles.get(m, m) for m in metrics],
                        vertical_spacing=min(0.12, 0.5 / rows))
    for r, (run_name, series) in enumerate(runs.items()):
        color, shown = PALETTE[r % len(PALETTE)], False
        for i, metric in enumerate(metrics):
            if metric not in series or not len(series[metric][0]):
                continue
            steps, values = series[metric]
            _add_curve(fig, steps, values, name=run_name, color=color, smoothing=smoothing, max_points=max_points,
                       row=i // cols + 1, col=i % cols + 1, legendgroup=run_name, showlegend=not shown)
            shown = True
    fig.update_xaxes(title_text="step", title_font={"size": 10}, title_standoff=2)
    fig.update_layout(template="plotly_white", uirevision="compare")
    legend_below(fig, plot_px=280 * rows, width_px=1150)  # above, two rows of run names covered the panels' titles
    return fig


def accuracy_figures(timelines: Sequence, medians: Sequence = ()
                     ) -> tuple[go.Figure, go.Figure, go.Figure, go.Figure, go.Figure]:
    """For `app.studies.comparison.Timeline`s: held-out accuracy against training minutes, against completion
    tokens, each run's peak memory, accuracy against optimizer steps, and against compute (TFLOP, `a2po.compute`).
    An A*-PO run is drawn twice on the time, token and compute figures: with its stage 1 (solid, shifted by the
    stage's time, tokens or FLOPs) and without it (dotted). `medians` (a study's median per method,
    `median_timeline`) are drawn bold over a band from the lowest to the highest seed, and the runs themselves thin
    beneath them. A run stored before its compute was counted has no curve against compute."""
    if not any(t.points for t in timelines):
        empty = empty_figure("Pick runs with a held-out set (eval_size > 0) to compare their accuracy")
        return (empty, empty_figure("No held-out accuracy yet"), empty_figure("No peak memory yet"),
                empty_figure("No held-out accuracy yet"), empty_figure("No held-out accuracy yet"))
    by_time, by_tokens, by_steps, by_compute = go.Figure(), go.Figure(), go.Figure(), go.Figure()
    method_color = {"a2po": PALETTE[0], "grpo": PALETTE[1]}
    drawn = [(t, False) for t in timelines] + [(m, True) for m in medians]
    for i, (t, is_median) in enumerate(drawn):
        if not t.points:
            continue
        color = method_color.get(t.method, PALETTE[i % len(PALETTE)]) if medians else PALETTE[i % len(PALETTE)]
        width, opacity = (3.5, 1.0) if is_median else ((1.2, 0.45) if medians else (2.0, 1.0))
        accuracy = [p.accuracy for p in t.points]
        steps = [p.step for p in t.points]
        variants = [("", t.stage1_seconds, t.stage1_tokens, t.stage1_flops, "solid")]
        if t.method == "a2po":
            variants.append((" without stage 1", 0.0, 0, 0.0, "dot"))
        counted = all(p.flops is not None for p in t.points)
        for suffix, seconds, tokens, flops, dash in variants:
            name = t.label + (" with stage 1" if suffix == "" and t.method == "a2po" else suffix)
            common = {"mode": "lines+markers", "name": name, "opacity": opacity,
                      "line": {"color": color, "dash": dash, "width": width},
                      "customdata": steps, "legendgroup": t.label, "meta": {"run_id": t.run_id, "method": t.method,
                                                                          "stage1": suffix == "",
                                                                          "median": is_median}}
            minutes = [round((p.seconds + seconds) / 60.0, 4) for p in t.points]
            counts = [p.tokens + tokens for p in t.points]
            tflop = [round(((p.flops or 0.0) + flops) / 1e12, 4) for p in t.points]
            if is_median and suffix == "":
                for fig, x in ((by_time, minutes), (by_tokens, counts), *([(by_compute, tflop)] if counted else [])):
                    _add_band(fig, x, t, color)
            if counted:
                by_compute.add_trace(go.Scatter(x=tflop, y=accuracy,
                                                hovertemplate="%{y:.0%} at %{x:,.4g} TFLOP (step %{customdata})",
                                                **common))
            by_time.add_trace(go.Scatter(x=minutes, y=accuracy,
                                         hovertemplate="%{y:.0%} at %{x:.2f} min (step %{customdata})", **common))
            by_tokens.add_trace(go.Scatter(x=counts, y=accuracy,
                                           hovertemplate="%{y:.0%} after %{x:,} tokens (step %{customdata})",
                                           **common))
        if is_median:
            _add_band(by_steps, steps, t, color)
        by_steps.add_trace(go.Scatter(x=steps, y=accuracy, mode="lines+markers", name=t.label, opacity=opacity,
                                      line={"color": color, "width": width}, legendgroup=t.label,
                                      meta={"run_id": t.run_id, "method": t.method, "median": is_median},
                                      hovertemplate="%{y:.0%} at step %{x}"))
    for fig, title, x_title in ((by_time, "Held-out accuracy against training time",
                                 "minutes of training (the run's clock: evaluations, loading and pauses left out)"),
                                (by_tokens, "Held-out accuracy against completion tokens generated",
                                 "completion tokens sampled"),
                                (by_steps, "Held-out accuracy against optimizer steps", "optimizer step"),
                                (by_compute, "Held-out accuracy against compute",
                                 "compute, TFLOP (FLOPs from the tokens processed: the same on any machine)")):
        fig.update_layout(template="plotly_white", title=title, uirevision="methods")
        legend_below(fig, plot_px=190)
        fig.update_xaxes(title_text=x_title)
        fig.update_yaxes(title_text="held-out accuracy", tickformat=".0%", rangemode="tozero")
    return by_time, by_tokens, memory_figure(timelines), by_steps, by_compute


def memory_figure(timelines: Sequence) -> go.Figure:
    """Each run's peak memory as a horizontal bar, the run's name beside it: runs' names are long (a duel's are
    40-odd characters), and under vertical bars they were rotated and cut off at the figure's foot."""
    with_memory = [t for t in timelines if t.peak_memory_gb is not None]
    if not with_memory:
        return empty_figure("No peak memory yet")
    bar_px = 26
    memory = go.Figure(go.Bar(y=[t.label for t in with_memory], x=[t.peak_memory_gb for t in with_memory],
                              orientation="h", text=[f"{t.peak_memory_gb:.2f} GB" for t in with_memory],
                              textposition="outside", textfont={"size": 11}, cliponaxis=False,
                              marker_color=[PALETTE[timelines.index(t) % len(PALETTE)] for t in with_memory],
                              hovertemplate="%{y}: %{x:.2f} GB<extra></extra>"))
    memory.update_layout(template="plotly_white", height=110 + bar_px * len(with_memory),
                         title="Peak memory (RSS on a CPU, CUDA peak on a GPU)",
                         margin={"l": 20, "r": 20, "t": 50, "b": 50})
    memory.update_yaxes(automargin=True, autorange="reversed")  # the runs in the order the table lists them
    memory.update_xaxes(title_text="GB", rangemode="tozero")
    return memory


def _add_band(fig: go.Figure, x: Sequence[float], median: Any, color: str) -> None:
    """The seeds' lowest-to-highest accuracy around a median curve, as a shaded band (two traces)."""
    low = [p.spread[0] if p.spread else p.accuracy for p in median.points]
    high = [p.spread[1] if p.spread else p.accuracy for p in median.points]
    name = f"{median.label}: seeds' range"
    fig.add_trace(go.Scatter(x=list(x), y=high, mode="lines", line={"width": 0, "color": color}, name=name,
                             legendgroup=median.label, showlegend=False, hoverinfo="skip",
                             meta={"band": "high", "method": median.method}))
    fig.add_trace(go.Scatter(x=list(x), y=low, mode="lines", line={"width": 0, "color": color}, fill="tonexty",
                             fillcolor=_transparent(color), name=name, legendgroup=median.label, hoverinfo="skip",
                             meta={"band": "low", "method": median.method}))


def _transparent(color: str, alpha: float = 0.15) -> str:
    """A `#rrggbb` colour as an `rgba(...)` with `alpha`."""
    value = color.lstrip("#")
    if len(value) != 6:
        return color
    red, green, blue = (int(value[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({red},{green},{blue},{alpha})"


def study_heatmap(heatmap: Any) -> go.Figure:
    """A sweep's median final held-out accuracy over its two fields (`app.studies.summary.Heatmap`), each cell
    labelled with its value; cells without a finished run are blank."""
    text = [["–" if v is None else f"{100 * v:.1f}%" for v in row] for row in heatmap.z]
    from a2po.sweep import show_value

    fig = go.Figure(go.Heatmap(z=heatmap.z, x=[show_value(v) for v in heatmap.x_values],
                               y=[show_value(v) for v in heatmap.y_values],
                               text=text, texttemplate="%{text}", colorscale="Viridis", zmin=0, zmax=1,
                               colorbar={"title": "accuracy", "tickformat": ".0%"},
                               hovertemplate=f"{heatmap.x_field}=%{{x}}, {heatmap.y_field}=%{{y}}: %{{text}}"
                                             "<extra></extra>"))
    fig.update_layout(template="plotly_white", height=360, margin={"l": 70, "r": 20, "t": 50, "b": 50},
                      title=f"Final held-out accuracy, median over seeds ({heatmap.method})")
    fig.update_xaxes(title_text=heatmap.x_field, type="category")
    fig.update_yaxes(title_text=heatmap.y_field, type="category")
    return fig


def study_bars(rows: Sequence[Any], best: Any = None) -> go.Figure:
    """A sweep's median final held-out accuracy per grid point, with the seeds' range as error bars (grids that are
    not two fields); the best point in the highlight colour."""
    shown = [r for r in rows if r.final is not None]
    if not shown:
        return empty_figure("No held-out accuracy yet: the study's runs have not evaluated")
    labels, fields = _point_names(shown)
    fig = go.Figure(go.Bar(
        x=labels, y=[r.final for r in shown],
        error_y={"type": "data", "symmetric": False, "array": [r.final_range[1] - r.final for r in shown],
                 "arrayminus": [r.final - r.final_range[0] for r in shown]},
        marker_color=[PALETTE[1] if r is best else PALETTE[0] for r in shown],
        hovertemplate="%{x}: %{y:.1%}<extra></extra>"))
    fig.update_layout(template="plotly_white", height=360, margin={"l": 50, "r": 20, "t": 50, "b": 120},
                      title="Final held-out accuracy per grid point (median over seeds, bars: their range)")
    fig.update_xaxes(title_text=fields, type="category")
    fig.update_yaxes(title_text="held-out accuracy", tickformat=".0%", rangemode="tozero")
    return fig


def _point_names(rows: Sequence[Any]) -> tuple[list[str], str]:
    """Short names for grid points that share their fields: the values alone ("8 · 1e-05 · None"), the fields
    named once in the returned title, so a long grid still fits under a bar or in a legend line; the method
    is added where the rows mix methods."""
    from a2po.sweep import show_value

    fields = list(rows[0].point) if rows else []
    mixed = len({r.method for r in rows}) > 1
    if not fields or any(list(r.point) != fields for r in rows):
        return [f"{r.label} ({r.method})" for r in rows], "grid point"
    names = [" · ".join(show_value(r.point[f]) for f in fields) + (f" ({r.method})" if mixed else "") for r in rows]
    return names, " · ".join(fields)


def legend_below(fig: go.Figure, plot_px: int, title: str | None = None, width_px: int = 560) -> None:
    """A horizontal legend at the bottom of the figure, under the x axis's title, the figure as tall as the plot
    (`plot_px`) and the legend's rows: a row per entry where the names are long (runs' names), two or more where
    they are short. Plotly would otherwise squeeze the plot to fit a legend taller than the room left for it and
    lay the first names over the axis's title. `width_px`: the figure's width where it shares a row of the page."""
    names = [str(t.name or "") for t in fig.data if t.showlegend is not False]
    per_row = max(1, width_px // (7 * max((len(n) for n in names), default=1) + 40))
    rows = math.ceil(len(names) / per_row) + (title is not None)
    legend_px = 21 * rows + 10
    axis_px = 60  # the tick labels and the axis's title
    fig.update_layout(height=50 + plot_px + axis_px + legend_px,
                      margin={"l": 50, "r": 20, "t": 50, "b": axis_px + legend_px},
                      legend={"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0, "x": 0,
                              "maxheight": legend_px + 10,
                              **({"title": {"text": title, "side": "top"}} if title is not None else {})})


def study_curves(rows: Sequence[Any], best: Any = None) -> go.Figure:
    """Each grid point's median held-out accuracy (`PointRow.curve`), the best one bold; against compute (TFLOP,
    stage 1 included) where every curve counted it, since points of other batch sizes compare at equal compute and
    not at equal steps, else against optimizer steps. A pruned point (halving) is dashed, where it stopped."""
    fig = go.Figure()
    drawn = [r for r in rows if r.curve is not None and r.curve.points]
    by_compute = bool(drawn) and all(p.flops is not None for r in drawn for p in r.curve.points)
    hover = "%{y:.0%} at %{x:,.4g} TFLOP" if by_compute else "%{y:.0%} at step %{x}"
    names, fields = _point_names(drawn)
    for i, (row, name) in enumerate(zip(drawn, names)):
        points = row.curve.points
        x = ([round((p.flops + row.curve.stage1_flops) / 1e12, 4) for p in points] if by_compute
             else [p.step for p in points])
        fig.add_trace(go.Scatter(x=x, y=[p.accuracy for p in points], mode="lines+markers",
                                 name=("★ " if row is best else "") + name
                                 + (f" — pruned at rung {row.rung}" if getattr(row, "pruned", False) else ""),
                                 line={"color": PALETTE[i % len(PALETTE)], "width": 4 if row is best else 1.8,
                                       "dash": "dash" if getattr(row, "pruned", False) else "solid"},
                                 hovertemplate=hover))
    if not fig.data:
        return empty_figure("No held-out accuracy yet")
    fig.update_layout(template="plotly_white", title="Median held-out accuracy per grid point")
    legend_below(fig, plot_px=210, title=fields + ":")
    fig.update_xaxes(title_text="compute, TFLOP (stage 1 included)" if by_compute else "optimizer step")
    fig.update_yaxes(title_text="held-out accuracy", tickformat=".0%", rangemode="tozero")
    return fig
