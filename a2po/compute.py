"""A run's compute in FLOPs, counted from the tokens it processes, so a budget means the same on every machine.

    forward pass (sampling, scoring, the reference):  2 * P * tokens
    forward and backward pass (training):            (4 * P + 2 * P_trainable) * tokens   (6 * P for a full fine-tune)

P is the model's parameter count without its embeddings (`transformers`' `num_parameters(exclude_embeddings=True)`,
what the Trainer's `floating_point_ops` uses), P_trainable the trainable share of it (the LoRA adapters under LoRA).
Every sequence counts its own prompt tokens and its completion tokens up to its end token, whatever the engine shares
or pads. The formula, what it leaves out and why: docs/compute.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class FlopsPerToken:
    """The FLOPs a token costs in a forward pass and in a training pass, from a model's parameter counts."""

    parameters: int  # P: without the embeddings
    trainable: int  # P_trainable: of those, the ones the optimizer updates

    @classmethod
    def of(cls, model: torch.nn.Module) -> FlopsPerToken:
        """The counts of `model` (a `PreTrainedModel`, or a `peft` model around one): every parameter outside an
        embedding module, each counted once (tied weights are one parameter)."""
        import torch  # here, so `format_flops` stays light for the pages
        embeddings = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
        seen: set[int] = set()
        parameters = trainable = 0
        for parameter in model.parameters():
            if id(parameter) in seen or id(parameter) in embeddings:
                continue
            seen.add(id(parameter))
            parameters += parameter.numel()
            trainable += parameter.numel() if parameter.requires_grad else 0
        return cls(parameters, trainable)

    def forward(self, tokens: int | float) -> float:
        """A forward pass over `tokens` tokens (sampling, scoring, the reference's log-probabilities)."""
        return 2.0 * self.parameters * float(tokens)

    def train(self, tokens: int | float) -> float:
        """A forward and backward pass over `tokens` tokens: the forward, the gradients of the activations through
        every weight, and the gradients of the trainable weights."""
        return (4.0 * self.parameters + 2.0 * self.trainable) * float(tokens)


def sequence_tokens(prompt_mask: Any, completion_mask: Any) -> int:
    """Tokens of a batch of sequences: each row's prompt and its completion up to its end token, without padding.
    `prompt_mask` has one row per prompt; with fewer rows than `completion_mask` (samples of a prompt), each prompt
    counts once per sample."""
    repeats = completion_mask.shape[0] // max(prompt_mask.shape[0], 1)
    return int(prompt_mask.sum()) * repeats + int(completion_mask.sum())


def format_flops(flops: float | None) -> str:
    """`3.2e15 FLOPs` as people read it: "3.2 PFLOP", "450 TFLOP", "12 GFLOP"; an en dash when unknown."""
    if flops is None:
        return "–"
    for size, unit in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if abs(flops) >= size:
            return f"{flops / size:.3g} {unit}"
    return f"{flops:.3g} FLOP"
