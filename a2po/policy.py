"""The policy and its reference, as both trainers set them up: the model and its tokenizer loaded, LoRA adapters,
the frozen reference copy (none with LoRA: the same weights with the adapters off) and its storage in the autocast
dtype, which is exact."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, TrainingArguments

from a2po.tokens import load_tokenizer, prepare_tokenizer


def load_policy(model: PreTrainedModel | str, args: TrainingArguments,
                processing_class: PreTrainedTokenizerBase | None = None
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy (`model`, or loaded from its name with `model_init_kwargs`) and its tokenizer, padding on the
    left."""
    model_path = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
    if isinstance(model, str):
        from a2po.models import resolve_model

        model_path = resolve_model(model)
        init_kwargs = dict(args.model_init_kwargs or {})
        init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        if "dtype" not in init_kwargs and "torch_dtype" not in init_kwargs:
            # transformers 5 loads a checkpoint in its stored dtype (bf16 for most hub models), and an optimizer
            # step on bf16 weights rounds away every update under half a bf16 step (2**-9 to 2**-8 of the weight),
            # most of them at a small learning rate: fp32 master weights, computed in bf16 or fp16 by autocast
            # (`bf16`, `fp16`). A dtype the user sets is their choice and is kept (TRL keeps the checkpoint's dtype
            # by default).
            init_kwargs["dtype"] = torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_path, **init_kwargs)
    if processing_class is None:
        revision = (args.model_init_kwargs or {}).get("revision")
        processing_class = load_tokenizer(model_path, revision=revision, trust_remote_code=args.trust_remote_code)
    else:
        prepare_tokenizer(processing_class)
    return model, processing_class


def with_reference(model: PreTrainedModel, args: TrainingArguments, peft_config: Any,
                   needs_reference: bool) -> tuple[PreTrainedModel, PreTrainedModel | None]:
    """The policy to train (with `peft_config`: its LoRA adapters) and the frozen reference copy, or None where the
    method needs none or LoRA's adapters switched off are the reference. Warns of trainable weights in half
    precision that the user did not ask for."""
    reference = None
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
        if args.gradient_checkpointing:
            model.enable_input_require_grads()
    elif needs_reference:
        # A frozen copy in the policy's dtype: a bf16 copy of fp32 weights computes another function (bf16 norms
        # and residual stream), so log pi - log pi_ref would not start at 0. Under autocast its matmul weights are
        # then stored in the autocast dtype (`cast_reference_matmuls`), which is exact.
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    half = sorted({str(p.dtype) for p in model.parameters()
                   if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
    explicit = {"dtype", "torch_dtype"} & set(args.model_init_kwargs or {})
    if half and not explicit:
        warnings.warn(f"The model's trainable weights are {', '.join(half)}: the optimizer updates them in that "
                      "precision, where small updates round away. Load the model in float32 (bf16=True or "
                      "fp16=True still computes in half precision).", stacklevel=3)
    return model, reference


def cast_reference_matmuls(reference: torch.nn.Module, dtype: torch.dtype) -> int:
    """Store the reference's linear layers (weights and biases) in `dtype`, the autocast dtype the policy computes
    its matmuls in; returns the bytes this frees. Exact: autocast casts an fp32 weight to `dtype` (round to nearest)
    before each matmul, which is the cast done here once, so the reference computes what the fp32 copy computed,
    and log pi/pi_ref is 0 before the first update. Everything else stays fp32: embeddings (a linear layer tied to
    one too: the embedding's fp32 output feeds the residual stream), norms and buffers."""
    shared = {id(p) for module in reference.modules() if not isinstance(module, torch.nn.Linear)
              for p in module.parameters(recurse=False)}
    freed = 0
    for module in reference.modules():
        if not isinstance(module, torch.nn.Linear) or id(module.weight) in shared:
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dtype == torch.float32:
                freed += param.numel() * (4 - torch.finfo(dtype).bits // 8)
                setattr(module, name, torch.nn.Parameter(param.detach().to(dtype), requires_grad=False))
    return freed
