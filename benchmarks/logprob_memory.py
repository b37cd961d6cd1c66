"""What a log-prob pass holds at a large vocabulary: the model's forward against the lean head (issue 46).

    python -m benchmarks.logprob_memory [--vocab 151936] [--completion 256] [--batch 8]

A one-layer Qwen2 model of q05's width and vocabulary, prepared by accelerate as the Trainer prepares the policy (bf16
autocast over fp32 weights, outputs cast to float32: the trainers' default under `bf16`), one process per
measurement: the growth of peak memory (the CUDA allocator's peak on a GPU, peak RSS on the CPU) over a forward and
backward pass of `per_token_logprobs` on `batch` completions, with the model's forward (`lean_head=False`:
full-vocabulary logits, their float32 copy, their gradient) and with the lean head.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure(vocab: int, completion: int, batch: int, lean: bool, cuda: bool) -> dict[str, Any]:
    """One pass in this process: peak memory before and after, in GiB."""
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, Qwen2Config

    from a2po.rollout import per_token_logprobs
    from benchmarks.training import peak_rss_gib

    device = "cuda" if cuda else "cpu"
    config = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=1,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).train()
    # As the Trainer prepares the policy: its forward under bf16 autocast, its outputs cast to float32.
    model = Accelerator(cpu=not cuda, mixed_precision="bf16").prepare_model(model)
    prompt = torch.randint(3, vocab, (batch, 16), device=device)
    completion_ids = torch.randint(3, vocab, (batch, completion), device=device)
    ones = torch.ones_like

    def peak() -> float:
        return torch.cuda.max_memory_allocated() / 2**30 if cuda else peak_rss_gib()

    before = peak()
    logps = per_token_logprobs(model, prompt, ones(prompt), completion_ids, ones(completion_ids), lean_head=lean,
                               autocast_dtype=torch.bfloat16)
    logps.sum().backward()
    return {"lean_head": lean, "peak_before_gib": before, "peak_after_gib": peak(), "growth_gib": peak() - before}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.logprob_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--one", choices=("forward", "lean"), help=argparse.SUPPRESS)  # a measurement's process
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if args.one:
        result = measure(args.vocab, args.completion, args.batch, args.one == "lean", cuda)
        print(json.dumps(result))
        return result
    results = {}
    for kind in ("forward", "lean"):
        done = subprocess.run([sys.executable, "-m", "benchmarks.logprob_memory", "--one", kind, "--vocab",
                               str(args.vocab), "--completion", str(args.completion), "--batch", str(args.batch)],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    memory = "CUDA allocator peak" if cuda else "peak RSS"
    print(f"{memory} growth of one log-prob forward and backward, {args.batch} x {args.completion} completion "
          f"tokens, vocab {args.vocab}: model's forward {results['forward']['growth_gib']:.2f} GiB, lean head "
          f"{results['lean']['growth_gib']:.2f} GiB")
    return results


if __name__ == "__main__":
    main()
