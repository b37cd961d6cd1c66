"""Named run specs: the defaults a studio run or a `python -m a2po train` starts from, defined once.

`A2POConfig` keeps TRL's defaults (a library user gets what TRL's users get); a *run*, from the dashboard's form,
its API or the command line, starts from a preset instead, so the three agree: an empty API spec, the form as it
opens and the bare CLI command describe the same run. `with_defaults(spec)` fills what a partial spec leaves out.

    "teaching-demo"   the default: learns visibly on a laptop CPU in a few minutes (SmolLM2, 2-digit sums)
    "quick-look"      stage 1 only: V* of 64 prompts in about a minute
    "step-by-step-gpu" Qwen2.5-0.5B-Instruct on reasoning-gym word problems, 512-token reasoning (a GPU; hub model)
    "custom"          the teaching demo's settings as a starting point to edit
    "teaching-demo-lora" the teaching demo training a LoRA adapter: the default on a ZeroGPU Space
    "none"            no preset: the library's own defaults for whatever a spec leaves out (`RunSpec`'s, and
                      `A2POConfig`'s, which are TRL's, for its settings)

Each preset is the one source of its run's defaults: a setting it does not name is the library's
(`a2po.runspec.config_default`), in the CLI, the dashboard's form and its API alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

NO_PRESET = "none"


def default_preset(environ: Mapping[str, str] | None = None) -> str:
    """The preset a run starts from: on a ZeroGPU Space (`SPACES_ZERO_GPU` true) the teaching demo with a LoRA
    adapter, since each of its short GPU calls restores and saves what it trains (docs/spaces.md, "What a chunk
    costs"); elsewhere the teaching demo."""
    env = os.environ if environ is None else environ
    zerogpu = env.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
    return "teaching-demo-lora" if zerogpu else "teaching-demo"


DEFAULT_PRESET = default_preset()

_TEACHING = {
    "name": "teaching-demo",
    "action": "train",
    "model": "SmolLM2-135M-Instruct",
    # An empty system message: SmolLM2's template would otherwise add its own, longer than the question, and prompt
    # tokens are most of what every forward and backward pass computes (docs/benchmarks.md, "The teaching demo from
    # the dashboard").
    "dataset": {"source": "arithmetic", "num_prompts": 256, "difficulty": 2, "operations": "+", "seed": 0,
                "eval_size": 64, "system_prompt": ""},
    "rewards": [{"name": "exact_match", "weight": 1.0}],
    # 8 epochs over the prompts stage 1 keeps (TRL's filter), at a constant 1e-5: of the recipes measured, the best
    # median held-out accuracy over run seeds whose click to finished fits in five minutes (docs/benchmarks.md,
    # "Choosing the teaching demo's recipe"); 2e-5 is unstable across seeds. The recipe search at equal compute
    # (selection, prompts per step and learning rate; docs/benchmarks.md) kept it as A*-PO's best point.
    # 12 completion tokens: the answer ("18 + 76 = 94") fits and the reward reads the last number, so a clipped
    # answer still scores; 16 decode longer for the same learning (docs/benchmarks.md, "The teaching demo from the
    # dashboard").
    "config": {"num_value_samples": 8, "beta1": 0.5, "beta2": 1e-3, "learning_rate": 1e-5, "max_steps": -1,
               "num_train_epochs": 8.0, "lr_scheduler_type": "constant",
               "per_device_train_batch_size": 8, "max_completion_length": 12, "temperature": 1.0,
               "gradient_checkpointing": False, "value_batch_size": 16, "per_device_eval_batch_size": 32,
               "logging_steps": 1, "seed": 0},
    "peft": None,
}

PRESETS: dict[str, dict[str, Any]] = {
    "teaching-demo": _TEACHING,
    "quick-look": {**_TEACHING, "name": "quick-look", "action": "values",
                   "dataset": {**_TEACHING["dataset"], "num_prompts": 64, "eval_size": 0}},
    # From the paper and the task, not from a measured run: the paper's learning rate and N, completions long enough
    # to reason, reasoning-gym's <answer> convention, which 0.5B instruct models follow where SmolLM2-135M does not.
    "step-by-step-gpu": {
        "name": "step-by-step-math", "action": "train", "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "dataset": {"source": "reasoning-gym", "task": "gsm_symbolic", "num_prompts": 1024, "eval_size": 128,
                    "seed": 0, "answer_format": "tags"},
        "rewards": [{"name": "task_checker", "weight": 1.0}],
        "config": {"num_value_samples": 8, "beta1": 0.5, "beta2": 1e-3, "learning_rate": 1e-6, "max_steps": -1,
                   "num_train_epochs": 1.0, "lr_scheduler_type": "constant", "per_device_train_batch_size": 16,
                   "max_completion_length": 512, "temperature": 1.0, "gradient_checkpointing": True,
                   "value_batch_size": 32, "per_device_eval_batch_size": 64, "eval_steps": 20, "logging_steps": 1,
                   "seed": 0},
        "peft": None,
    },
    "custom": {**_TEACHING, "name": "custom-run"},
    # The demo training a LoRA adapter: what a ZeroGPU chunk restores and saves is then the adapter, not the model and
    # its optimizer state. An adapter of rank 16 needs a larger step than every weight: of 2e-4, 5e-4 and 1e-3 (measured
    # as a ZeroGPU visitor's chunks run it, seeds 0-2), 2e-4 learned best and 1e-3 collapsed (docs/benchmarks.md,
    # "The teaching presets, measured"); the full fine-tune's 1e-5 barely moved it.
    "teaching-demo-lora": {**_TEACHING, "name": "teaching-demo-lora", "peft": {"r": 16, "lora_alpha": 32},
                           "config": {**_TEACHING["config"], "learning_rate": 2e-4}},
}
PRESET_DESCRIPTIONS = {
    "teaching-demo": "Teaching demo: SmolLM2 learns 2-digit sums on a laptop CPU in a few minutes; held-out "
                     "accuracy before and after. Measured: 0% -> 59% (median of 3 seeds) in about 7 minutes from the "
                     "click on a busy 2-core CPU; its recipe (prompts some reference sample solved, 8 a step, 1e-5) is "
                     "A*-PO's best in the recipe search (69%, median of 3 seeds, at 4e13 FLOPs).",
    "quick-look": "Quick look: stage 1 only, V* of 64 prompts (about a minute on a CPU).",
    "step-by-step-gpu": "Step-by-step math on a GPU: Qwen2.5-0.5B-Instruct reasons through grade-school word "
                        "problems (reasoning-gym gsm_symbolic, <answer> tags, 512 tokens); needs the hub model (or its "
                        "folder) and a GPU.",
    "custom": "Custom: start from the demo's settings and change anything.",
    "teaching-demo-lora": "Teaching demo with LoRA: the demo training a LoRA adapter (r 16, learning rate 2e-4) "
                          "instead of every weight; the default on a ZeroGPU Space, where each short GPU call restores "
                          "and saves what it trains. Measured as such a Space runs it: held-out accuracy 0% -> 66% "
                          "(median of 3 seeds; every weight: 59%) in about 6 minutes on a 2-core CPU.",
    "none": "No preset: the library's own defaults for every setting (A2POConfig's, which are TRL's: 256 "
            "completion tokens, learning rate 5e-5, gradient checkpointing).",
}
