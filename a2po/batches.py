"""What one optimizer step trains on, for either method: prompts, completions and generations per prompt.

TRL's GRPO counts completions in `per_device_train_batch_size` (a common source of confusion: huggingface/trl
issues 3061 and 3443); A*-PO counts prompts, one completion each, plus its N reference samples per prompt once, in
stage 1. `batch_figures` is the one place that turns a run's settings into these figures; the Launch page, the pair
plan, the Run page and the verdict all show its `text()`. See docs/selection.md, "Batch figures".

No torch here: the studio's web process imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from a2po.settings import METHODS, config_default, samples_stage_one, setting_of


@dataclass(frozen=True)
class BatchFigures:
    """One optimizer step of a run, over every process."""

    method: str  # "a2po" or "grpo"
    prompts_per_step: int
    generations_per_prompt: int  # completions sampled per prompt at each step: 1 for A*-PO, G for GRPO
    completions_per_step: int  # prompts_per_step * generations_per_prompt: what the gradient rests on
    completions_per_micro_batch: int  # one process's forward/backward pass
    stage1_samples_per_prompt: int  # N reference samples per prompt, once before training; 0 without stage 1
    processes: int

    def text(self) -> str:
        """The figures in one line, e.g. "8 prompts per step × 8 completions each (G) = 64 completions per step"."""
        each = "1 completion each" if self.generations_per_prompt == 1 else (
            f"{self.generations_per_prompt} completions each (G)")
        line = (f"{self.prompts_per_step:,} prompts per step × {each} = {self.completions_per_step:,} completions "
                f"per step ({self.completions_per_micro_batch:,} per micro-batch")
        line += f", {self.processes} processes)" if self.processes > 1 else ")"
        if self.stage1_samples_per_prompt:
            why = "" if self.method == "a2po" else ", to select prompts by pass rate"
            line += f"; stage 1: {self.stage1_samples_per_prompt} reference samples per prompt, once{why}"
        return line


def batch_figures(method: str, config: Mapping[str, Any] | Any, num_processes: int = 1) -> BatchFigures:
    """The batch figures of a run of `method` ("a2po" or "grpo") with `config`: a run spec's `config` mapping (a
    setting it leaves out takes the library's default) or an `A2POConfig`/`GRPOConfig`.

    TRL 1.16's semantics: A*-PO's `per_device_train_batch_size` counts prompts (one completion each at training
    time); GRPO's counts completions, and one generation of `per_device_train_batch_size * num_processes *
    gradient_accumulation_steps` completions (TRL's default `generation_batch_size`, `steps_per_generation` =
    `gradient_accumulation_steps`) holds that over `num_generations` prompts, G completions each.
    """
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}: batch figures exist for 'a2po' and 'grpo'.")

    def setting(name: str) -> int:
        value = setting_of(config, name, method)
        return int(config_default(name, method) if value is None else value)

    processes = max(int(num_processes or 1), 1)
    micro = setting("per_device_train_batch_size")
    per_step = micro * setting("gradient_accumulation_steps") * processes
    if method == "a2po":
        return BatchFigures(method, prompts_per_step=per_step, generations_per_prompt=1,
                            completions_per_step=per_step, completions_per_micro_batch=micro,
                            stage1_samples_per_prompt=setting("num_value_samples"), processes=processes)
    group = setting("num_generations")
    stage1 = setting("num_value_samples") if samples_stage_one(method, config) else 0
    return BatchFigures(method, prompts_per_step=per_step // group, generations_per_prompt=group,
                        completions_per_step=per_step // group * group, completions_per_micro_batch=micro,
                        stage1_samples_per_prompt=stage1, processes=processes)


def spec_batch_figures(spec: Mapping[str, Any]) -> BatchFigures | None:
    """`batch_figures` of a run spec (its method, config and processes); None for a spec that cannot say (not a
    mapping, no batch size stated, as in a spec stored before the studio wrote every setting, or settings that are
    not numbers): not guessed."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("config"), Mapping) or \
            spec["config"].get("per_device_train_batch_size") is None:
        return None
    try:
        return batch_figures(spec.get("method") or "a2po", spec.get("config") or {},
                             int(spec.get("num_processes") or spec.get("num_devices") or 1))
    except (TypeError, ValueError, ZeroDivisionError):
        return None
