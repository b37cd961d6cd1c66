"""The Run page's header: the run's title line and facts (engine, times, remaining, accuracy) and its two
progress bars."""

from __future__ import annotations

import html
from typing import Any

from a2po.batches import spec_batch_figures
from a2po.settings import uses_vllm
from app.web.common import elapsed_seconds, format_duration, format_time, progress_bar, status_badge
from app.web.pages.run.frame import expected_prompts, value_count
from app.web.remaining import Remaining, estimate_remaining, training_seconds
from storage.lifecycle import UNFINISHED


def stage_progress(run: dict[str, Any], split: str, value_set: dict[str, Any] | None) -> str:
    """Two progress bars: stage 1 (V* estimation) and stage 2 (training, or evaluation for evaluate runs). Stage 1
    samples the training prompts, then the held-out ones; its bar says which it is at, with that split's count."""
    action, stage, status = run["action"], run.get("stage"), run["status"]
    progress = run.get("progress") or 0.0
    done = status == "finished"
    num_values = value_count(run, split)
    expected = expected_prompts(run)
    if value_set is not None and value_set.get("complete"):
        s1, d1 = 1.0, f"{num_values} prompts"
    elif stage == "values":
        train = value_count(run, "train")
        held_out = (run.get("config") or {}).get("dataset", {}).get("eval_size")
        s1 = progress
        if expected is not None and train >= expected and held_out:  # the training prompts are done
            d1 = f"held-out prompts {value_count(run, 'eval')} / {held_out} (the {train} training prompts done)"
        else:
            d1 = f"training prompts {train} / {expected}" if expected else f"{train} training prompts"
    elif action == "evaluate" and not run.get("value_set_id"):
        s1, d1 = None, "not needed"
    else:
        s1 = 1.0 if (done or stage in ("train", "eval")) and num_values else (0.0 if status in UNFINISHED else None)
        d1 = f"{num_values} prompts" if num_values else "waiting"
    bars = [progress_bar("Stage 1 · V* estimation", s1, d1, elem="progress-stage1")]
    if action != "values":
        label = "Evaluation" if action == "evaluate" else "Stage 2 · A*-PO training"
        if done:
            s2, d2 = 1.0, "done"
        elif stage in ("train", "eval"):
            s2, d2 = progress, f"stage {stage}"
        else:
            s2, d2 = (0.0, "waiting for stage 1") if status in UNFINISHED else (None, "not reached")
        bars.append(progress_bar(label, s2, d2, elem="progress-stage2"))
    return "".join(bars)


def accuracy_change(evaluations: list[dict[str, Any]]) -> str:
    """"accuracy 6% -> 55%": held-out greedy accuracy at the first evaluation (step 0: before training) and at the
    latest one, from `Store.get_evaluations` rows; "" before any evaluation."""
    points = sorted((e["step"], e["metrics"]["eval_accuracy"]) for e in evaluations
                    if isinstance((e.get("metrics") or {}).get("eval_accuracy"), (int, float)))
    if not points:
        return ""
    (first_step, first), (last_step, last) = points[0], points[-1]
    if len(points) == 1:
        when = "before training" if first_step == 0 else f"at step {first_step}"
        return f'<span id="run-accuracy">held-out accuracy <b>{first:.0%}</b> {when}</span>'
    return (f'<span id="run-accuracy">held-out accuracy <b>{first:.0%} → {last:.0%}</b> '
            f"(step {first_step} → step {last_step}, greedy, same prompts)</span>")


def remaining_text(estimate: Remaining) -> str:
    """"remaining ≈ 2m 03s" (the whole run), "remaining ≥ 30s (training not measured yet)" or "remaining ≈ –"."""
    if estimate.text().startswith("≥"):
        shown = f"remaining {estimate.text()} ({' and '.join(estimate.unknown)} not measured yet)"
    else:
        shown = f"remaining ≈ {estimate.text()}"
    return f'<span id="run-remaining">{html.escape(shown)}</span>'


def sampler(spec: dict[str, Any] | None) -> str:
    """The engine that samples a run (stage 1, rollouts, evaluation), from its spec: vLLM in the training process
    where it says so (`a2po.settings.uses_vllm`: the worker follows the spec), else the library's own decoder."""
    config = (spec or {}).get("config") or {}
    if not uses_vllm(config):
        return "the native decoder"
    mode = config.get("vllm_mode") or "colocate"
    return "vLLM (colocated)" if mode == "colocate" else f"vLLM ({mode})"


def header(run: dict[str, Any], evaluations: list[dict[str, Any]] | None = None,
           clock: dict[str, float] | None = None) -> str:
    """The run's title line and facts: the engine that samples it (`sampler`), its times (wall time since it
    started; training time and the remaining estimate from its clock, `clock_from_metrics`) and its accuracy before
    and after training."""
    done = len({e["step"] for e in evaluations or []})
    estimate = estimate_remaining(run, clock, done or None)
    parts = [f"### #{run['id']} {html.escape(run['name'])} {status_badge(run['status'])}",
             f"**{run['action']}** · model `{run['model']}` · dataset `{run['dataset']}` · sampled by "
             f'<span id="run-sampler">{html.escape(sampler(run.get("config")))}</span> · stage '
             f"`{run.get('stage') or '–'}` · created {format_time(run['created_at'])} · wall time "
             f"{format_duration(elapsed_seconds(run))} · training time {format_duration(training_seconds(clock))} · "
             + remaining_text(estimate)]
    figures = spec_batch_figures(run.get("config"))
    if figures is not None and run.get("action") == "train":
        parts.append(f'<span id="run-batch">per optimizer step: {html.escape(figures.text())}</span>')
    change = accuracy_change(evaluations or [])
    if change:
        parts.append(change)
    elif run.get("best_eval_accuracy") is not None:
        parts.append(f"best eval accuracy **{run['best_eval_accuracy']:.1%}**")
    return "\n\n".join(parts)
