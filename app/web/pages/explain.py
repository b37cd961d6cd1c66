"""Explain page: A*-PO in three pictures, for a class.

1. The V* calculator: N reference samples, k of them correct, beta1 -> V* = beta1 * log(mean_i exp(r_i / beta1)),
   drawn for every k against the plain mean (k/N) and the max (any correct sample gives 1).
2. What stage 2 regresses, for the run at hand: each sample's implicit reward beta2 * log(pi/pi_ref) against its
   target r - V*, coloured by step, with the diagonal the loss pulls toward.
3. One prompt across training: its implicit reward step by step, next to the two targets it can have (1 - V* when
   the sample is correct, -V* when it is not).

The formulas are `a2po.core`'s; the figures are pure functions of plain rows, so they are tested without a page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from a2po.answers import CORRECT_THRESHOLD
from a2po.settings import uses_vllm
from app.access.gate import Services
from app.web.common import run_choices

MAX_POINTS = 3000


def optimal_value(k: int, n: int, beta1: float) -> float:
    """V* for k correct of n binary rewards: beta1 * log((k * e^(1/beta1) + (n - k)) / n), computed stably."""
    from a2po.core import optimal_value as v_star

    return float(v_star([[1.0] * k + [0.0] * (n - k)], beta1)[0])


def value_curve_figure(n: int, beta1: float, k: int) -> go.Figure:
    """V* against the fraction of correct samples, beside the plain mean and the max; the chosen k marked."""
    ks = list(range(n + 1))
    fractions = [i / n for i in ks]
    figure = go.Figure()
    figure.add_scatter(x=fractions, y=[optimal_value(i, n, beta1) for i in ks], mode="lines+markers",
                       name=f"V* (β₁ = {beta1:g})", line={"width": 3})
    figure.add_scatter(x=fractions, y=fractions, mode="lines", name="plain mean k/N", line={"dash": "dot"})
    figure.add_scatter(x=fractions, y=[0.0] + [1.0] * n, mode="lines", name="max", line={"dash": "dash"},
                       line_shape="hv")
    figure.add_scatter(x=[k / n], y=[optimal_value(k, n, beta1)], mode="markers+text", name=f"k = {k}",
                       marker={"size": 14, "color": "#dc2626"}, text=[f"{optimal_value(k, n, beta1):.4f}"],
                       textposition="top left", showlegend=False)
    figure.update_layout(height=340, margin={"l": 50, "r": 10, "t": 30, "b": 40}, legend={"orientation": "h"},
                         xaxis_title=f"fraction of the N = {n} reference samples that are correct",
                         yaxis_title="value", yaxis_range=[-0.05, 1.08])
    return figure


def calculator(n: float, beta1: float, k: float) -> tuple[str, go.Figure]:
    """The calculator's text and figure (k is clipped to 0..N; beta1 must be > 0)."""
    n = max(1, int(n or 1))
    k = min(max(0, int(k or 0)), n)
    if not beta1 or not math.isfinite(beta1) or beta1 <= 0:
        return "β₁ must be > 0.", go.Figure()
    v = optimal_value(k, n, beta1)
    text = (f"**V\\* = {v:.4f}** for {k} correct of N = {n} at β₁ = {beta1:g} (plain mean {k / n:.4f}, max "
            f"{1.0 if k else 0.0:g}). A small β₁ makes V\\* close to the max: one correct sample is enough to call "
            "the prompt solvable; a large one brings it to the mean.")
    return text, value_curve_figure(n, beta1, k)


def regression_figure(samples: Sequence[dict[str, Any]]) -> go.Figure:
    """Implicit reward (x) against the target r - V* (y) of stage-2 samples, coloured by step, with y = x."""
    rows = [s for s in samples if s.get("implicit_reward") is not None and s.get("advantage") is not None]
    figure = go.Figure()
    if not rows:
        figure.add_annotation(text="No training samples yet", showarrow=False, x=0.5, y=0.5, xref="paper",
                              yref="paper")
        figure.update_layout(height=380)
        return figure
    rows = rows[-MAX_POINTS:]
    xs = [r["implicit_reward"] for r in rows]
    ys = [r["advantage"] for r in rows]
    figure.add_scatter(x=xs, y=ys, mode="markers", name="samples",
                       marker={"color": [r["step"] for r in rows], "colorscale": "Viridis", "size": 7,
                               "opacity": 0.75, "colorbar": {"title": "step"}},
                       text=[f"step {r['step']} · r = {r['reward']:g} · V* = {r['v_star']:.3f}" for r in rows],
                       hovertemplate="%{text}<br>β₂·log π/π_ref = %{x:.4f}<br>r − V* = %{y:.4f}<extra></extra>")
    low = min(min(xs), min(ys), -1.0)
    high = max(max(xs), max(ys), 1.0)
    figure.add_scatter(x=[low, high], y=[low, high], mode="lines", name="target: β₂·log π/π_ref = r − V*",
                       line={"dash": "dash", "color": "#6b7280"})
    figure.update_layout(height=420, margin={"l": 50, "r": 10, "t": 30, "b": 40}, legend={"orientation": "h"},
                         xaxis_title="implicit reward β₂·log π(y|x)/π_ref(y|x)", yaxis_title="target r − V*(x)")
    return figure


def prompt_figure(samples: Sequence[dict[str, Any]], v_star: float | None) -> go.Figure:
    """One prompt's implicit reward step by step (green: correct sample, red: wrong) and its two targets."""
    rows = sorted((s for s in samples if s.get("implicit_reward") is not None), key=lambda s: s["step"])
    figure = go.Figure()
    if rows:
        figure.add_scatter(x=[r["step"] for r in rows], y=[r["implicit_reward"] for r in rows], mode="lines+markers",
                           name="β₂·log π/π_ref of the step's sample",
                           marker={"size": 9, "color": [
                               "#16a34a" if (r["reward"] or 0) >= CORRECT_THRESHOLD else "#dc2626" for r in rows]},
                           text=[r["completion"][:80] for r in rows], hovertemplate="%{text}<extra></extra>")
    if v_star is not None:
        for target, label in ((1 - v_star, "target if correct: 1 − V*"), (-v_star, "target if wrong: −V*")):
            figure.add_hline(y=target, line_dash="dash", annotation_text=f"{label} = {target:.3f}")
    figure.update_layout(height=340, margin={"l": 50, "r": 10, "t": 30, "b": 40}, xaxis_title="step",
                         yaxis_title="implicit reward", showlegend=False)
    return figure


def pass_at_n_text(evaluations: Sequence[dict[str, Any]], eval_samples: Sequence[dict[str, Any]],
                   num_samples: int | None) -> str:
    """What pass@N is and is not, with the run's own figures: the reference pass rates on the held-out prompts,
    the trained policy's greedy accuracy on them, and how many of them it solves although no reference sample did
    (V* = 0: stage 1 would have dropped them)."""
    n = f"pass@{num_samples}" if num_samples else "pass@N"
    text = (f"Stage 1 keeps a prompt when at least one of its N reference samples is right, so the reference "
            f"{n} is the share of prompts stage 2 can **train on**. It is not a limit on the trained model: what it "
            "learns on the kept prompts carries over to others, including prompts no reference sample solved.")
    points = sorted((e["step"], e["metrics"]) for e in evaluations
                    if isinstance((e.get("metrics") or {}).get("eval_accuracy"), (int, float)))
    if not points:
        return text + "\n\nPick a run with held-out prompts to see its figures."
    first_step, first = points[0]
    last_step, last = points[-1]
    parts = [f"reference pass@1 **{first['eval_ref_pass_at_1']:.0%}**" if "eval_ref_pass_at_1" in first else "",
             f"reference {n} **{first['eval_ref_pass_at_n']:.0%}**" if "eval_ref_pass_at_n" in first else "",
             f"greedy accuracy **{first['eval_accuracy']:.0%}** at step {first_step}",
             f"**{last['eval_accuracy']:.0%}** at step {last_step}" if last_step != first_step else ""]
    text += "\n\nThis run, on its held-out prompts: " + ", ".join(p for p in parts if p) + "."
    final = [x for x in eval_samples if x["step"] == last_step]
    beyond = sum(1 for x in final if (x.get("reward") or 0) >= CORRECT_THRESHOLD and (x.get("v_star") or 0) <= 0)
    if final and last_step != first_step:
        text += (f" At step {last_step} the trained model answers **{beyond}** of the {len(final)} held-out prompts "
                 "correctly although none of their reference samples was right.")
    return text


def engine_text(spec: dict[str, Any] | None) -> str:
    """Which engine sampled a run, from its spec (`a2po.settings.uses_vllm`: the worker follows it), and what it
    sampled."""
    spec = spec or {}
    config = spec.get("config") or {}
    sampled = ("its groups of G answers and the evaluations' answers" if spec.get("method") == "grpo" else
               "stage 1's reference samples, the stage-2 answers and the evaluations' answers")
    if uses_vllm(config):
        return (f"**Sampled by vLLM**, colocated (one engine in the training process, given the policy's weights "
                f"after every optimizer step): {sampled}. The log-probabilities in the loss, and so the implicit "
                "rewards drawn here, are the trainer's own forward passes.")
    return f"**Sampled by the native decoder** (the library's own, on the trainer's model): {sampled}."


def build_explain_page(services: Services) -> gr.Dropdown:
    """Lay out the page; returns its run picker (refreshed when the page is opened)."""
    store = services.store
    gr.Markdown("## How A*-PO works\n**Stage 1** samples N answers per prompt from the reference model and scores "
                "them 0 or 1. Their soft maximum is **V\\*(x)**, the value of the best the reference model can do on "
                "that prompt. **Stage 2** samples one answer from the model being trained and moves its *implicit "
                "reward* β₂·log π/π_ref toward **r − V\\*** (the answer's reward above what the prompt is worth): "
                "up for answers better than expected, down for worse ones.")
    gr.Markdown("### 1. The V\\* calculator\nV\\* = β₁ · log( mean_i exp(r_i / β₁) )")
    with gr.Row():
        n = gr.Slider(1, 64, value=8, step=1, label="N: reference samples", elem_id="explain-n")
        k = gr.Slider(0, 64, value=1, step=1, label="k: correct samples", elem_id="explain-k")
        beta1 = gr.Number(value=0.5, label="β₁", minimum=0.001, elem_id="explain-beta1")
    text, figure = calculator(8, 0.5, 1)
    value = gr.Markdown(text, elem_id="explain-value")
    curve = gr.Plot(figure, label="V* against the fraction correct", elem_id="explain-curve")
    for control in (n, k, beta1):
        control.change(calculator, [n, beta1, k], [value, curve], api_visibility="private", show_progress="hidden")

    gr.Markdown("### 2. What stage 2 regresses\nEach dot is one training answer: across, the implicit reward the "
                "model gives it now; up, the target r − V\\*. The loss is the squared distance to the dashed line, so "
                "as training goes on (lighter colours) the dots move toward it. With a small β₂ (the default 0.001) a "
                "short run moves the implicit reward by thousandths while the targets span ±1: the dots stay near the "
                "vertical axis, and the loss stays large even as accuracy rises (β₂ sets how far the model may move).")
    with gr.Row():
        picker = gr.Dropdown(choices=run_choices(store), label="Run", scale=3, elem_id="explain-run")
        refresh = gr.Button("Refresh", size="sm", scale=0, min_width=100)
    engine = gr.Markdown(elem_id="explain-engine")
    scatter = gr.Plot(label="Implicit reward against its target", elem_id="explain-scatter")
    gr.Markdown("### 3. One prompt across training\nThe implicit reward of the answer sampled for one prompt at each "
                "step: green when that answer was right, red when wrong; the dashed lines are where the loss pulls "
                "each kind.")
    prompt = gr.Dropdown(label="Prompt", elem_id="explain-prompt", allow_custom_value=False)
    trajectory = gr.Plot(label="One prompt's implicit reward", elem_id="explain-trajectory")
    gr.Markdown("### 4. pass@N is not a ceiling")
    passn = gr.Markdown(pass_at_n_text([], [], None), elem_id="explain-pass-at-n")

    def load_run(run_id: int | None):
        if run_id is None:
            return (regression_figure([]), gr.Dropdown(choices=[], value=None), prompt_figure([], None),
                    pass_at_n_text([], [], None), "")
        run = store.get_run(int(run_id)) or {}
        num_samples = ((run.get("config") or {}).get("config") or {}).get("num_value_samples")
        eval_samples = store.get_samples(int(run_id), split="eval", limit=MAX_POINTS, newest_first=True)
        explained = pass_at_n_text(store.get_evaluations(int(run_id)), eval_samples, num_samples)
        samples = store.get_samples(int(run_id), split="train", limit=MAX_POINTS, newest_first=True)[::-1]
        counts: dict[str, int] = {}
        texts: dict[str, str] = {}
        for s in samples:
            counts[s["prompt_id"]] = counts.get(s["prompt_id"], 0) + 1
            texts[s["prompt_id"]] = s["prompt_text"]
        ranked = sorted(counts, key=lambda pid: -counts[pid])
        choices = [(f"{_question(texts[pid])[:80]} ({counts[pid]} steps)", pid) for pid in ranked]
        first = ranked[0] if ranked else None
        return (regression_figure(samples), gr.Dropdown(choices=choices, value=first), _prompt(run_id, first),
                explained, engine_text(run.get("config")))

    def _prompt(run_id: int | None, prompt_id: str | None) -> go.Figure:
        if run_id is None or not prompt_id:
            return prompt_figure([], None)
        rows = [s for s in store.get_samples(int(run_id), split="train", limit=MAX_POINTS, newest_first=True)
                if s["prompt_id"] == prompt_id]
        return prompt_figure(rows, rows[0]["v_star"] if rows else None)

    common = {"api_visibility": "private", "show_progress": "hidden"}
    shown = [scatter, prompt, trajectory, passn, engine]
    picker.change(load_run, picker, shown, **common)
    refresh.click(load_run, picker, shown, **common)
    prompt.change(_prompt, [picker, prompt], trajectory, **common)

    gr.Markdown("### 5. A*-PO against GRPO: why the costs differ\nPick an A*-PO run and a GRPO run (the Launch "
                "page's \"A*-PO vs GRPO\" starts a matched pair): their own figures, from the stored metrics.")
    pair = gr.Dropdown(choices=run_choices(store), multiselect=True, label="A*-PO run and GRPO run",
                       elem_id="explain-pair")
    costs = gr.Markdown(elem_id="explain-costs")
    pair.change(lambda ids: cost_text(store, ids), pair, costs, **common)
    return picker, pair


def cost_text(store: Any, run_ids: Sequence[int] | None) -> str:
    """Section 5's text for the picked runs: the first A*-PO and the first GRPO run among them."""
    from app.studies import comparison
    from app.studies.protocols import PROTOCOLS

    runs = [r for r in (store.get_run(int(i)) for i in run_ids or []) if r is not None]
    timelines = [comparison.store_timeline(store, r) for r in runs]
    view = comparison.study_view(runs, timelines)
    pair = view.pair()  # the medians of a study's seeds, else the first run of each method
    if pair is None:
        return "Pick one A*-PO run and one GRPO run (or the runs of an A*-PO vs GRPO study)."
    configs = {t.run_id: (r.get("config") or {}).get("config") or {} for t, r in zip(timelines, runs, strict=True)}
    text = comparison.cost_explanation(*pair, configs[pair[0].run_id], configs[pair[1].run_id])
    return text + (f"\n\n**Protocol:** {PROTOCOLS[view.protocol]}" if view.protocol in PROTOCOLS else "")


def _question(text: str) -> str:
    """The user's question in a chat-templated prompt (the text after the last user turn marker), else the text."""
    for marker in ("<|im_start|>user", "<|user|>", "user\n"):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    for end in ("<|im_end|>", "<|end|>"):
        text = text.split(end, 1)[0]
    return " ".join(text.split())
