"""The tokenizer as the trainers and the playground's model process use it: set up for batched decoding (a pad token,
left padding), the ids that end a completion, a prompt to ids and completions back to text."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from a2po.core import completion_mask
from a2po.shown import shown


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer` set up for batched decoding: its EOS pads when it has no pad token, and prompts pad on the left
    (a decoder-only model continues the last token). Returns it."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_tokenizer(model_path: str, revision: str | None = None,
                   trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """A model's tokenizer, set up for batched decoding (`prepare_tokenizer`)."""
    return prepare_tokenizer(AutoTokenizer.from_pretrained(model_path, revision=revision,
                                                           trust_remote_code=trust_remote_code))


def end_token_ids(model: Any, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids that end a completion: the model's generation config's EOS ids (chat models have several, such
    as `<|im_end|>` beside the tokenizer's EOS), else the tokenizer's, and the tokenizer's EOS in any case."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None) or tokenizer.eos_token_id
    return sorted({*([eos] if isinstance(eos, int) else eos), tokenizer.eos_token_id} - {None})


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Any) -> str:
    """A prompt as the model reads it: a string as it is, a conversation through the chat template with the
    generation prompt."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    raise TypeError(f"A prompt must be a string or a list of {{'role', 'content'}} messages, got "
                    f"{shown(prompt, 80)}.")


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Any,
                  max_prompt_length: int | None = None) -> tuple[str, list[int]]:
    """(text, token ids) of a prompt (`render_prompt`); a prompt longer than `max_prompt_length` keeps its last
    tokens, so the generation prompt (the end of a chat template) is never cut. Special tokens are added to a plain
    string only: a chat template writes its own."""
    text = render_prompt(tokenizer, prompt)
    ids = tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
    return text, ids if max_prompt_length is None else ids[-max_prompt_length:]


def decode_completions(tokenizer: PreTrainedTokenizerBase, completion_ids: torch.Tensor,
                       end_ids: list[int]) -> tuple[list[str], torch.Tensor]:
    """(texts, mask) of sampled completions, (batch, T) ids: each text up to its first end token (`end_ids`), the
    mask 1 on the tokens kept, that end token included (`a2po.core.completion_mask`)."""
    mask = completion_mask(completion_ids, end_ids)
    texts = tokenizer.batch_decode(completion_ids * mask + tokenizer.pad_token_id * (1 - mask),
                                   skip_special_tokens=True)
    return texts, mask
