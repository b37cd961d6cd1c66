"""Named GRPO recipes: the `GRPOConfig` settings TRL's paper index gives each GRPO variant, applied by name.

TRL trains DAPO, Dr. GRPO, GSPO, Lite PPO, CISPO, SAPO, GDPO and LUSPO with one `GRPOTrainer`, each a set of
`GRPOConfig` settings listed in its paper index (huggingface/trl, docs/source/paper_index.md, "Group Relative Policy
Optimization"). A run names one (`RunSpec.recipe`; `python -m a2po train --method grpo --recipe dapo`; the Launch
form; the GRPO side of "A*-PO vs GRPO") and its own settings win over the recipe's: the recipe fills only what the
run leaves out.

A recipe carries the algorithm's switches (loss, clipping, advantage scaling, masking, KL, importance-sampling level,
reward aggregation), never the paper's scale (batch size, G, completion length, sampling temperature), which depends
on the model and the machine, and which the duel copies from the A*-PO run so both methods sample alike. What a
paper's TRL configuration also sets that the recipe leaves out is in its `left_out`.

Some switches change the update only when training is off-policy, i.e. when the policy has moved since it sampled:
the clipping bounds (epsilon, epsilon_high), GSPO's sequence-level ratio, CISPO's clip and SAPO's temperatures. With
num_iterations = 1 every ratio pi / pi_old is 1 when the gradient is taken, so they change nothing (TRL's paper index
says so of GSPO); `off_policy_note` says which, for a config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from a2po.shown import shown


@dataclass(frozen=True)
class Recipe:
    """A named GRPO variant: the `GRPOConfig` settings TRL's paper index gives it (`settings`), the paper's arXiv id,
    which of its settings act only off-policy, and what the paper's configuration sets that the recipe leaves out."""

    name: str
    title: str
    arxiv: str
    settings: Mapping[str, Any]
    off_policy: tuple[str, ...] = ()
    left_out: str = ""
    needs_several_rewards: bool = False  # GDPO: one reward function has nothing to normalize separately

    def describe(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"{self.title} (arXiv {self.arxiv}): {settings}."


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("dapo", "DAPO", "2503.14476",
           {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "mask_truncated_completions": True,
            "beta": 0.0},
           off_policy=("epsilon", "epsilon_high"),
           left_out="the paper's scale (per_device_train_batch_size=512, num_generations=16, "
                    "max_completion_length=20480), its soft overlong punishment reward, and dynamic sampling (not in "
                    "TRL)"),
    Recipe("dapo-high-entropy", "DAPO on the 20% highest-entropy tokens (Beyond the 80/20 Rule)", "2506.01939",
           {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "mask_truncated_completions": True,
            "beta": 0.0, "top_entropy_quantile": 0.2},
           off_policy=("epsilon", "epsilon_high"),
           left_out="DAPO's scale and soft overlong punishment reward, as for dapo"),
    # TRL's paper index gives Dr. GRPO's loss_type and beta; GRPOConfig's scale_rewards help adds that the paper
    # drops the std scaling ("The Dr. GRPO paper recommends not scaling rewards"): both halves of the fix.
    Recipe("dr-grpo", "Dr. GRPO", "2503.20783",
           {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0},
           left_out="the paper's scale (per_device_train_batch_size=1, num_generations=8, max_completion_length=3000)"),
    Recipe("gspo", "GSPO", "2507.18071",
           {"importance_sampling_level": "sequence", "loss_type": "grpo", "beta": 0.0, "epsilon": 3e-4,
            "epsilon_high": 4e-4},
           off_policy=("importance_sampling_level", "epsilon", "epsilon_high"),
           left_out="gradient_accumulation_steps=1 and steps_per_generation=4 (four optimizer steps per generation; "
                    "this trainer has no steps_per_generation: num_iterations > 1 trains off-policy instead)"),
    Recipe("lite-ppo", "Lite PPO (Tricks or Traps?)", "2508.08221",
           {"scale_rewards": "batch", "loss_type": "dapo", "beta": 0.0},
           left_out="the paper's sampling and scale (top_p=0.99, top_k=100, temperature=0.99, num_generations=8, "
                    "per_device_train_batch_size=4, gradient_accumulation_steps=32, steps_per_generation=8)"),
    # TRL's paper index gives CISPO (MiniMax-M1, 2506.13585) as ScaleRL's recipe (2510.13786).
    Recipe("cispo", "CISPO (as ScaleRL runs it)", "2506.13585",
           {"loss_type": "cispo", "epsilon_high": 5.0, "scale_rewards": "batch"},
           off_policy=("epsilon_high",),
           left_out="num_generations=16 and cast_lm_head_to_fp32=True (ScaleRL, arXiv 2510.13786)"),
    Recipe("sapo", "SAPO", "2511.20347",
           {"loss_type": "sapo", "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05, "scale_rewards": "group"},
           off_policy=("sapo_temperature_pos", "sapo_temperature_neg")),
    Recipe("gdpo", "GDPO", "2601.05242",
           {"multi_objective_aggregation": "normalize_then_sum"}, needs_several_rewards=True),
    Recipe("luspo", "LUSPO", "2602.05261",
           {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 2e-3, "epsilon_high": 2.5e-3},
           off_policy=("importance_sampling_level", "epsilon", "epsilon_high")),
)}
RECIPE_SETTINGS = tuple(dict.fromkeys(k for r in RECIPES.values() for k in r.settings))
"""Every setting some recipe sets: what the Launch form refills when a recipe is picked."""


class RecipeError(ValueError):
    """A recipe name that is not one of `RECIPES`."""


def canonical_name(name: str) -> str:
    """`name` as `RECIPES` spells it ("Dr_GRPO" -> "dr-grpo"); `RecipeError` listing the recipes if there is none."""
    key = str(name).strip().lower().replace("_", "-").replace(". ", "-").replace(" ", "-")
    if key not in RECIPES:
        raise RecipeError(f"Unknown GRPO recipe {shown(name)}: use one of {', '.join(RECIPES)} (or none for TRL's "
                          "GRPOConfig defaults).")
    return key


def recipe_settings(name: str) -> dict[str, Any]:
    """The `GRPOConfig` settings of recipe `name` (a copy)."""
    return dict(RECIPES[canonical_name(name)].settings)


def apply_recipe(name: str | None, config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with recipe `name`'s settings where it has none of its own (None: `config` unchanged)."""
    if name is None:
        return dict(config)
    return {**recipe_settings(name), **config}


def off_policy_note(name: str | None, config: Mapping[str, Any], num_rewards: int = 1) -> str:
    """Why some of the recipe's settings will change nothing in a run with `config`: those that act only off-policy
    when num_iterations is 1, and GDPO's aggregation with one reward function. Empty when every setting acts."""
    if name is None:
        return ""
    recipe = RECIPES[canonical_name(name)]
    notes = []
    if recipe.off_policy and int(config.get("num_iterations") or 1) == 1:
        verb = "acts" if len(recipe.off_policy) == 1 else "act"
        notes.append(f"{', '.join(recipe.off_policy)} {verb} only off-policy: with num_iterations = 1 every ratio "
                     "pi / pi_old is 1 when the gradient is taken, so they change nothing. Set num_iterations > 1 "
                     "(optimizer steps per generation) for them to act.")
    if recipe.needs_several_rewards and num_rewards < 2:
        notes.append("multi_objective_aggregation acts only with more than one reward function: with one, it is "
                     "plain GRPO.")
    return " ".join(notes)
