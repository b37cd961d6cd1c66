"""Whether A*-PO and GRPO learn, with nothing downloaded: a small transformer is built in code, taught the teaching
task's format (2-digit sums, `a2po.data`'s question, the answer then `<|end|>`) by supervised steps until it answers
some held-back sums, then trained from that checkpoint by A*-PO and by GRPO on other sums; greedy accuracy on sums
that neither saw, before and after.

    python -m benchmarks.learning --out learning.json [--size gpu|cpu|tiny] [--seconds 100]

`gpu` (the default where CUDA is) is a 4-layer, 256-wide Llama with the character tokenizer of `a2po.testing`,
trained in bf16 autocast over fp32 weights (the trainers' default precision); `cpu` a 3-layer, 128-wide one that
learns on a small CPU in minutes (`--seconds 1000`); `tiny` is the test suite's size (the pipeline, not learning).
Kept for each method: the loss, reward and log-ratio history (A*-PO's log pi/pi_ref; GRPO's KL to its reference,
beta 0.001), and on a GPU the CUDA allocator's figures. `--seconds` bounds the whole run: supervised
steps stop at their share of it, and each method's training at its own. The JSON is written after every phase, so
a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from a2po.data import ARITHMETIC_TEMPLATE


@dataclass(frozen=True)
class Shape:
    """The model and the work of one size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    sft_batch: int
    sft_lr: float
    sft_target: float         # supervised steps stop once the probe sums are answered this well
    sft_max_steps: int        # ... or after this many steps, or their share of the time
    eval_prompts: int
    probe_prompts: int
    train_prompts: int
    rl_steps: int
    rl_batch: int             # prompts per step, both methods (A*-PO: one completion each; GRPO: G each)
    num_samples: int          # A*-PO's N, GRPO's G
    rl_lr: float


SIZES = {
    "gpu": Shape(hidden=256, layers=4, heads=4, kv_heads=2, sft_batch=256, sft_lr=1e-3, sft_target=0.35,
                 sft_max_steps=100_000, eval_prompts=256, probe_prompts=128, train_prompts=512, rl_steps=32,
                 rl_batch=16, num_samples=8, rl_lr=1e-4),
    # What this 2-core CPU shows in about 7 minutes (docs/benchmarks.md, "GPU").
    "cpu": Shape(hidden=128, layers=3, heads=4, kv_heads=2, sft_batch=64, sft_lr=2e-3, sft_target=0.35,
                 sft_max_steps=100_000, eval_prompts=128, probe_prompts=64, train_prompts=128, rl_steps=16,
                 rl_batch=8, num_samples=8, rl_lr=1e-4),
    "tiny": Shape(hidden=64, layers=2, heads=4, kv_heads=2, sft_batch=32, sft_lr=3e-3, sft_target=0.35,
                  sft_max_steps=60, eval_prompts=16, probe_prompts=8, train_prompts=16, rl_steps=2, rl_batch=4,
                  num_samples=2, rl_lr=1e-4),
}
MAX_COMPLETION = 6  # "198" and <|end|> fit
# Of `--seconds`: the supervised steps' share; each method gets an equal part of what is left after them.
SFT_SHARE = 0.4


def sums(seed: int, shape: Shape) -> dict[str, list[dict[str, Any]]]:
    """Every 2-digit sum once, shuffled and split: held-out (eval), probe (when to stop teaching), RL prompts, and
    the rest for the supervised steps. Rows as `a2po.data.arithmetic_dataset` makes them."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user", "content": ARITHMETIC_TEMPLATE.format(a=a, op="+", b=b)}],
             "ground_truth": str(a + b)} for a, b in pairs]
    cuts = [shape.eval_prompts, shape.eval_prompts + shape.probe_prompts,
            shape.eval_prompts + shape.probe_prompts + shape.train_prompts]
    return {"eval": rows[:cuts[0]], "probe": rows[cuts[0]:cuts[1]], "train": rows[cuts[1]:cuts[2]],
            "supervised": rows[cuts[2]:]}


def accuracy(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], autocast: Any) -> float:
    """Greedy exact-match accuracy on `rows` (the trainers' held-out metric)."""
    import torch

    from a2po.rewards import exact_match
    from a2po.rollout import sample_completions

    device = next(model.parameters()).device
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast():
        out = sample_completions(model, batch.input_ids, batch.attention_mask, max_new_tokens=MAX_COMPLETION,
                                 eos_token_ids=[end, tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                                 do_sample=False)
    model.train(was_training)
    answers = tokenizer.batch_decode(out, skip_special_tokens=True)
    return sum(exact_match(answers, [r["ground_truth"] for r in rows])) / len(rows)


def supervised(model: Any, tokenizer: Any, split: dict[str, list], shape: Shape, seconds: float,
               autocast: Any) -> dict[str, Any]:
    """Supervised steps on the answers (and their end token) until the probe accuracy reaches the target, the step
    limit or `seconds`; the loss and probe accuracy histories. The sums are tokenized once, on the device."""
    import torch

    from a2po.rollout import positions_from_mask

    device = next(model.parameters()).device
    rows = split["supervised"]
    prompts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    answers = [r["ground_truth"] + "<|end|>" for r in rows]
    encoded = tokenizer([p + a for p, a in zip(prompts, answers)], return_tensors="pt", padding=True,
                        add_special_tokens=False)
    labels = encoded.input_ids.clone()
    for i, answer in enumerate(answers):  # learn the answer and its end token only (left padding)
        labels[i, :-len(tokenizer(answer, add_special_tokens=False).input_ids)] = -100
    ids, mask, labels = encoded.input_ids.to(device), encoded.attention_mask.to(device), labels.to(device)
    positions = positions_from_mask(mask)
    optimizer = torch.optim.AdamW(model.parameters(), lr=shape.sft_lr)
    generator = torch.Generator().manual_seed(0)
    history: list[dict[str, float]] = []
    start, step = time.perf_counter(), 0
    model.train()

    def checkpoint_history(loss: float) -> float:
        probe = accuracy(model, tokenizer, split["probe"], autocast)
        history.append({"step": step, "loss": loss, "probe_accuracy": probe, "seconds": time.perf_counter() - start})
        return probe

    while time.perf_counter() - start < seconds and step < shape.sft_max_steps:
        pick = torch.randint(len(rows), (shape.sft_batch,), generator=generator).to(device)
        with autocast():
            loss = model(input_ids=ids[pick], attention_mask=mask[pick], position_ids=positions[pick],
                         labels=labels[pick]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 100 == 0 and checkpoint_history(loss.item()) >= shape.sft_target:
            break
    if not history or history[-1]["step"] != step:
        checkpoint_history(loss.item())
    return {"steps": step, "seconds": time.perf_counter() - start, "history": history,
            "probe_accuracy": history[-1]["probe_accuracy"], "target": shape.sft_target}


def train_method(method: str, model_dir: Path, split: dict[str, list], shape: Shape, cuda: bool, seconds: float,
                 workdir: Path) -> dict[str, Any]:
    """One method from the taught checkpoint on the RL prompts, at the trainers' default precision (fp32 weights,
    bf16 autocast on a GPU); stopped after `seconds` of training at the latest."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from a2po import A2POConfig, A2POTrainer, GRPOConfig, GRPOTrainer
    from a2po.rewards import exact_match

    class Deadline(TrainerCallback):
        def __init__(self) -> None:
            self.at = time.monotonic() + seconds

        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() > self.at:
                control.should_training_stop = True

    common = dict(output_dir=str(workdir / method), per_device_train_batch_size=shape.rl_batch,
                  max_steps=shape.rl_steps, learning_rate=shape.rl_lr, lr_scheduler_type="constant",
                  max_completion_length=MAX_COMPLETION, logging_steps=1, report_to="none", save_strategy="no",
                  bf16=cuda, use_cpu=not cuda, gradient_checkpointing=False, seed=0, disable_tqdm=True)
    if method == "a2po":
        # The paper's setting: every prompt trains, those no reference sample solved too.
        args = A2POConfig(num_value_samples=shape.num_samples, beta1=0.5, beta2=1e-3, filter_all_incorrect=False,
                          save_values=False, **common)
        trainer_class = A2POTrainer
    else:
        # A GRPO micro-batch counts completions: G micro-batches of `rl_batch` make `rl_batch` prompts a step, as
        # A*-PO's (benchmarks.training's GRPO settings).
        args = GRPOConfig(num_generations=shape.num_samples, gradient_accumulation_steps=shape.num_samples,
                          beta=0.001, **common)
        trainer_class = GRPOTrainer
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = trainer_class(model=str(model_dir), reward_funcs=exact_match, args=args,
                            train_dataset=Dataset.from_list(split["train"]), callbacks=[Deadline()])
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    policy = trainer.accelerator.unwrap_model(trainer.model)
    after = accuracy(policy, trainer.processing_class, split["eval"], autocast_for(cuda))
    logged = [h for h in trainer.state.log_history if "loss" in h and "step" in h]
    ratio_key = "log_ratio" if method == "a2po" else "kl"
    history = {key: [h.get(source) for h in logged]
               for key, source in (("step", "step"), ("loss", "loss"), ("reward", "reward"), ("log_ratio", ratio_key))}
    return {"method": method, "steps": trainer.state.global_step, "seconds": elapsed, "eval_accuracy_after": after,
            "history": history, "log_ratio_is": "log pi/pi_ref" if method == "a2po" else "KL to pi_ref (k3)",
            "weights_dtype": str(next(policy.parameters()).dtype).removeprefix("torch."),
            "compute": "bfloat16 autocast" if cuda else "float32", "cuda": cuda_figures() if cuda else None,
            "stage1_s": trainer.rollout_stats.get("values", {}).get("seconds")}


def cuda_figures() -> dict[str, float]:
    """The CUDA caching allocator's figures since the last peak reset, in GiB (and its retry and OOM counts)."""
    import torch

    stats = torch.cuda.memory_stats()
    gib = {name: stats.get(key, 0) / 2**30 for name, key in (
        ("peak_allocated_gib", "allocated_bytes.all.peak"), ("peak_reserved_gib", "reserved_bytes.all.peak"),
        ("allocated_now_gib", "allocated_bytes.all.current"), ("reserved_now_gib", "reserved_bytes.all.current"))}
    return {**gib, "alloc_retries": stats.get("num_alloc_retries", 0), "ooms": stats.get("num_ooms", 0)}


def autocast_for(cuda: bool) -> Callable[[], Any]:
    import torch

    return (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext


def run(size: str, cuda: bool, seconds: float, workdir: Path, report: Callable[[dict[str, Any]], None]
        ) -> dict[str, Any]:
    """The whole check; `report` gets the result so far after each phase."""
    import torch

    from a2po.testing import make_tiny_model

    shape = SIZES[size]
    split = sums(0, shape)
    autocast = autocast_for(cuda)
    result: dict[str, Any] = {"size": size, "shape": asdict(shape), "device": "cuda" if cuda else "cpu",
                              "prompts": {k: len(v) for k, v in split.items()}, "seconds_budget": seconds}
    model, tokenizer = make_tiny_model(None, hidden_size=shape.hidden, num_layers=shape.layers,
                                       num_heads=shape.heads, num_kv_heads=shape.kv_heads, initializer_range=0.02)
    model.to("cuda" if cuda else "cpu")
    result["params"] = sum(p.numel() for p in model.parameters())
    result["eval_accuracy_untrained"] = accuracy(model, tokenizer, split["eval"], autocast)
    result["supervised"] = supervised(model, tokenizer, split, shape, SFT_SHARE * seconds, autocast)
    result["eval_accuracy_before"] = accuracy(model, tokenizer, split["eval"], autocast)
    if cuda:
        result["supervised"]["cuda"] = cuda_figures()
    model_dir = workdir / "taught"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    report(result)
    spent = result["supervised"]["seconds"]
    result["methods"] = {}
    for i, method in enumerate(("a2po", "grpo")):
        left = max(1.0, (seconds - spent - sum(m["seconds"] for m in result["methods"].values())) / (2 - i))
        result["methods"][method] = train_method(method, model_dir, split, shape, cuda, 0.8 * left, workdir)
        result["methods"][method]["eval_accuracy_before"] = result["eval_accuracy_before"]
        if cuda:
            torch.cuda.empty_cache()
        report(result)
    return result


def summary_line(result: dict[str, Any]) -> str:
    taught = result["supervised"]
    parts = [f"{result['params'] / 1e6:.1f}M-param model taught {taught['steps']} steps in {taught['seconds']:.0f} s "
             f"(probe {taught['probe_accuracy']:.0%}); held-out accuracy on {result['prompts']['eval']} sums "
             f"{result['eval_accuracy_before']:.1%} before RL"]
    for method, run_ in result.get("methods", {}).items():
        parts.append(f"{method}: {run_['eval_accuracy_after']:.1%} after {run_['steps']} steps "
                     f"({run_['seconds']:.0f} s)")
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import tempfile

    import torch

    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file (written after every phase)")
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="gpu where CUDA is, else tiny")
    parser.add_argument("--seconds", type=float, default=100.0, help="the whole run's time, roughly")
    parser.add_argument("--cpu", action="store_true", help="the CPU even where a GPU is")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    size = args.size or ("gpu" if cuda else "tiny")
    out = Path(args.out)

    def report(result: dict[str, Any]) -> None:
        out.write_text(json.dumps(result, indent=1))

    with tempfile.TemporaryDirectory(prefix="a2po-learning-") as workdir:
        result = run(size, cuda, args.seconds, Path(workdir), report)
    report(result)
    print(summary_line(result))
    return result


if __name__ == "__main__":
    main()
