"""Run by tests/a2po/test_grpo_trainer.py, once alone and once under `accelerate launch --num_processes 2` (gloo on the
CPU): GRPO's global batch is split between the processes, each sampling whole groups for its own prompts."""

import json
import sys
from pathlib import Path

from datasets import Dataset

from a2po import GRPOConfig, GRPOTrainer

model_dir, out, batch_size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])


def coin(completions, **kwargs):
    return [float(sum(map(ord, c)) % 2 == 0) for c in completions]


data = Dataset.from_list([{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(8)])
args = GRPOConfig(output_dir=str(out / "run"), per_device_train_batch_size=batch_size, num_generations=2, max_steps=4,
                  max_completion_length=5, num_iterations=2, beta=0.04, learning_rate=1e-2, use_cpu=True,
                  report_to="none", save_strategy="steps", save_steps=3, logging_steps=1, disable_tqdm=True,
                  gradient_checkpointing=False)
trainer = GRPOTrainer(model=model_dir, reward_funcs=coin, args=args, train_dataset=data)
trainer.train()
logged = [h for h in trainer.state.log_history if "loss" in h]
report = {"losses": [h["loss"] for h in logged], "completion_tokens": logged[-1]["completion_tokens"],
          "prompts_per_step": args.prompts_per_step,
          "checkpoint": sorted(p.name for p in (out / "run" / "checkpoint-3").iterdir())}
(out / f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(report))
trainer.accelerator.end_training()  # destroys the process group before the interpreter exits
