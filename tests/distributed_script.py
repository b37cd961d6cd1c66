"""Run by tests/a2po/test_cli.py under `accelerate launch --num_processes 2 --cpu`: stage 1 sharded, stage 2 in DDP."""

import json
import sys
from pathlib import Path

from datasets import Dataset

from a2po import A2POCallback, A2POConfig, A2POTrainer

model_dir, out = sys.argv[1], Path(sys.argv[2])


class CountSeen(A2POCallback):
    """Stage-1 rows the callbacks of this process saw (every process's: the batches are gathered)."""

    seen = 0

    def on_values_batch(self, args, state, control, records, **kwargs):
        CountSeen.seen += len(records)


def coin(completions, **kwargs):
    return [float(len(c) % 2 == 0) for c in completions]


data = Dataset.from_list([{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(10)])
args = A2POConfig(output_dir=str(out / "run"), per_device_train_batch_size=2, max_steps=2, num_value_samples=4,
                  max_completion_length=4, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                  filter_all_incorrect=False, disable_tqdm=True)
trainer = A2POTrainer(model=model_dir, reward_funcs=coin, args=args, train_dataset=data, callbacks=[CountSeen()])
trainer.train()
table = trainer.value_tables["train"]
rank = trainer.accelerator.process_index
report = {"prompt_ids": list(table["prompt_id"]), "v_star": list(table["v_star"]),
          "sampled_here": trainer.rollout_stats["values"]["sequences"] // args.num_value_samples,
          "seen_by_callbacks": CountSeen.seen, "global_step": trainer.state.global_step}
(out / f"rank{rank}.json").write_text(json.dumps(report))
trainer.accelerator.end_training()  # destroys the process group before the interpreter exits
