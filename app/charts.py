"""Plotly figure builders for the dashboard: pure functions from lists and dicts to `go.Figure`.

Nothing here touches the database or Gradio, so every builder is unit-testable. Long series are downsampled
(`downsample`) before drawing so a chart stays responsive with many thousands of logged steps, and training curves
are drawn twice: the raw values faint, the exponential moving average (`ema`) on top.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
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
]
UNSMOOTHED = {"learning_rate"}  # a schedule, not a noisy measurement
MAX_POINTS = 1000
RAW_OPACITY = 0.25


def ema(values: Sequence[float | None], smoothing: float) -> list[float]:
    """Debiased exponential moving average (as TensorBoard draws it).

    `smoothing` in [0, 1): 0 returns the values unchanged, 0.9 averages over roughly the last ten points.
    Missing values (None, NaN) are carried over from the previous smoothed point (NaN before the first value).
    """
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    out: list[float] = []
    last, weight = 0.0, 0.0
    for value in values:
        if value is None or math.isnan(value):
            out.append(last / weight if weight else math.nan)
            continue
        last = smoothing * last + (1 - smoothing) * value
        weight = smoothing * weight + (1 - smoothing)
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


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank figure that shows `message` in its middle (for charts with nothing to draw yet)."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 14, "color": "#888"})
    fig.update_layout(template="plotly_white", height=height, xaxis_visible=False, yaxis_visible=False,
                      margin={"l": 20, "r": 20, "t": 30, "b": 20})
    return fig


def _add_curve(fig: go.Figure, steps: Sequence[float], values: Sequence[float], *, name: str, color: str,
               smoothing: float, max_points: int, row: int | None = None, col: int | None = None,
               legendgroup: str | None = None, showlegend: bool = True) -> None:
    """Raw line (faint) plus its EMA; both downsampled after smoothing so the smoothing sees every point."""
    where = {"row": row, "col": col} if row is not None else {}
    smooth = ema(values, smoothing) if smoothing > 0 else list(values)
    if smoothing > 0:
        rx, ry = downsample(steps, values, max_points)
        fig.add_trace(go.Scatter(x=rx, y=ry, mode="lines", name=f"{name} (raw)", line={"color": color, "width": 1},
                                 opacity=RAW_OPACITY, hoverinfo="skip", showlegend=False, legendgroup=legendgroup),
                      **where)
    sx, sy = downsample(steps, smooth, max_points)
    mode = "lines+markers" if len(sx) <= 30 else "lines"
    fig.add_trace(go.Scatter(x=sx, y=sy, mode=mode, name=name, line={"color": color, "width": 2},
                             marker={"size": 4}, legendgroup=legendgroup, showlegend=showlegend), **where)


def training_figure(series: Mapping[str, Series], smoothing: float = 0.6, max_points: int = MAX_POINTS,
                    ceilings: Mapping[str, float] | None = None,
                    metrics: Sequence[tuple[str, str]] = TRAINING_METRICS) -> go.Figure:
    """Grid of training curves, one panel per metric in `metrics` that has data.

    `ceilings` ({"pass@1": 0.4, "pass@N": 0.8}) are drawn as dashed horizontal lines on the eval accuracy panel:
    the reference policy's pass rates bound what A*-PO can reach.
    """
    present = [(key, title) for key, title in metrics if series.get(key) and len(series[key][0])]
    if not present:
        return empty_figure("Waiting for the first logged training step…")
    cols = 2
    rows = math.ceil(len(present) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[title for _, title in present],
                        vertical_spacing=min(0.12, 0.5 / rows), horizontal_spacing=0.08)
    for i, (key, _title) in enumerate(present):
        row, col = i // cols + 1, i % cols + 1
        steps, values = series[key]
        _add_curve(fig, steps, values, name=key, color=PALETTE[i % len(PALETTE)],
                   smoothing=0.0 if key in UNSMOOTHED else smoothing, max_points=max_points, row=row, col=col,
                   showlegend=False)
        if key == "learning_rate":
            fig.update_yaxes(tickformat=".2~e", row=row, col=col)
        if key == "eval_accuracy" and ceilings:
            for j, (label, level) in enumerate(ceilings.items()):
                if level is not None and math.isfinite(level):
                    fig.add_hline(y=level, row=row, col=col, line={"dash": "dash", "color": "#999", "width": 1},
                                  annotation_text=f"reference {label} {level:.2f}",
                                  annotation_position="top left" if j else "bottom left",
                                  annotation_font={"size": 10, "color": "#666"})
    fig.update_xaxes(title_text="step", title_font={"size": 10}, title_standoff=2)
    fig.update_layout(template="plotly_white", height=240 * rows + 40, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                      uirevision="training", hovermode="x unified")
    return fig


def value_histogram(v_stars: Sequence[float | None], filtered: Sequence[bool] | None = None,
                    bins: int = 30) -> go.Figure:
    """Histogram of V* over prompts; filtered prompts (dropped before stage 2) stacked in their own color."""
    if not v_stars:
        return empty_figure("No V* estimates yet")
    filtered = list(filtered) if filtered is not None else [False] * len(v_stars)
    kept = [v for v, f in zip(v_stars, filtered, strict=True) if v is not None and not f]
    dropped = [v for v, f in zip(v_stars, filtered, strict=True) if v is not None and f]
    fig = go.Figure()
    fig.add_trace(go.Histogram(x=kept, name=f"kept ({len(kept)})", nbinsx=bins, marker_color=PALETTE[0]))
    if dropped:
        fig.add_trace(go.Histogram(x=dropped, name=f"filtered ({len(dropped)})", nbinsx=bins,
                                   marker_color="#bbbbbb"))
    fig.update_layout(template="plotly_white", barmode="stack", height=300, title="V* over prompts",
                      xaxis_title="V*(x)", yaxis_title="prompts", margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right"})
    return fig


def correct_count_bar(num_correct: Sequence[int], num_samples: int) -> go.Figure:
    """Bar chart: how many prompts had k correct reference samples out of N, for k = 0..N (k = 0 in grey)."""
    if not num_correct:
        return empty_figure("No reference samples yet")
    n = max(num_samples, max(num_correct))
    counts = np.bincount(np.asarray(num_correct, dtype=int), minlength=n + 1)
    colors = ["#bbbbbb"] + [PALETTE[2]] * n
    fig = go.Figure(go.Bar(x=list(range(n + 1)), y=counts.tolist(), marker_color=colors, name="prompts",
                           hovertemplate="%{x} of " + str(n) + " correct: %{y} prompts<extra></extra>"))
    fig.update_layout(template="plotly_white", height=300, title=f"Correct reference samples (out of N={n})",
                      xaxis_title="correct samples", yaxis_title="prompts", xaxis={"dtick": 1},
                      margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


def reference_pass_rates(num_correct: Sequence[int], num_samples: int) -> dict[str, float]:
    """pass@1 (mean fraction of correct samples) and pass@N (fraction of prompts with any correct sample)."""
    if not num_correct or num_samples < 1:
        return {"pass@1": math.nan, "pass@N": math.nan}
    arr = np.asarray(num_correct, dtype=float)
    return {"pass@1": float(np.mean(arr / num_samples)), "pass@N": float(np.mean(arr > 0))}


def pass_rate_figure(pass_at_1: float, pass_at_n: float, num_samples: int,
                     eval_accuracy: float | None = None) -> go.Figure:
    """Reference pass@1 and pass@N as bars (pass@N is the ceiling A*-PO cannot pass), plus the best eval accuracy."""
    labels = ["reference pass@1", f"reference pass@{num_samples} (ceiling)"]
    values = [pass_at_1, pass_at_n]
    colors = [PALETTE[0], "#999999"]
    if eval_accuracy is not None:
        labels.append("trained policy (best eval)")
        values.append(eval_accuracy)
        colors.append(PALETTE[2])
    fig = go.Figure(go.Bar(x=values, y=labels, orientation="h", marker_color=colors,
                           text=[f"{v:.1%}" if v is not None and math.isfinite(v) else "–" for v in values],
                           textposition="auto"))
    fig.add_vline(x=pass_at_n, line={"dash": "dash", "color": "#666"})
    fig.update_layout(template="plotly_white", height=220, title="Pass rates", xaxis={"range": [0, 1.02],
                      "tickformat": ".0%"}, margin={"l": 200, "r": 20, "t": 50, "b": 30})
    return fig


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
    fig.update_layout(template="plotly_white", height=280 * rows + 60, uirevision="compare",
                      margin={"l": 50, "r": 20, "t": 60, "b": 40},
                      legend={"orientation": "h", "y": 1.02 + 0.1 / rows, "x": 0})
    return fig
