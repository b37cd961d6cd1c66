"""Tiny random-init models with a character-level tokenizer, built in code: for tests, demos and benchmarks.

Nothing here downloads anything. `make_tiny_model("/tmp/tiny")` writes a directory that `from_pretrained`
(and so `A2POTrainer(model="/tmp/tiny")`) loads in well under a second.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII, with a chat template and pad/eos tokens."""
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", padding_side="left")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_model(path: str | Path | None = None, arch: str = "llama", hidden_size: int = 64,
                    num_layers: int = 2, seed: int = 0):
    """Build a random-init causal LM (`arch` "llama" or "qwen2") and its tokenizer.

    Returns `(model, tokenizer)`; with `path`, also saves both there so the path works as a model id.
    """
    tokenizer = make_char_tokenizer()
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_cls(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=1024, tie_word_embeddings=True, initializer_range=0.2,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model, tokenizer
