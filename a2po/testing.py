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
                    num_layers: int = 2, seed: int = 0, num_heads: int = 4, num_kv_heads: int = 2,
                    tie_word_embeddings: bool = True, initializer_range: float = 0.2):
    """Build a random-init causal LM (`arch` "llama" or "qwen2") and its tokenizer.

    `num_heads` / `num_kv_heads` set the grouped-query ratio and `tie_word_embeddings=False` gives the model its own
    output matrix: the shapes the decoder must handle. The large default `initializer_range` makes an untrained
    model's samples varied; a model to be trained wants the usual 0.02. Returns `(model, tokenizer)`; with `path`,
    also saves both there so the path works as a model id.
    """
    tokenizer = make_char_tokenizer()
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_cls(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                        max_position_embeddings=1024, tie_word_embeddings=tie_word_embeddings,
                        initializer_range=initializer_range, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]
    if path is not None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return model, tokenizer


def teach_answers(model, tokenizer, prompts: list, answers: list[str], steps: int = 300,
                  learning_rate: float = 3e-3, seed: int = 0):
    """Supervised-train `model` to answer each prompt with its answer then `<|end|>` (memorisation, in place).

    Gives tests a small model that solves exactly the prompts it was taught, so stage 1 finds correct samples
    for those and none for the rest, whatever the random stream: a deterministic mix of kept and filtered prompts.
    """
    from a2po.rollout import positions_from_mask

    torch.manual_seed(seed)
    end = "<|end|>"
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if not isinstance(p, str)
             else p for p in prompts]
    batch = tokenizer([t + a + end for t, a in zip(texts, answers)], return_tensors="pt", padding=True,
                      add_special_tokens=False)
    labels = batch.input_ids.clone()
    for i, answer in enumerate(answers):
        learned = len(tokenizer(answer + end, add_special_tokens=False).input_ids)
        labels[i, :-learned] = -100  # learn the answer and its end token only
    positions = positions_from_mask(batch.attention_mask)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=positions,
                     labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return loss.item()
