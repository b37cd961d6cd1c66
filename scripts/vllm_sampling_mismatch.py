"""How far vLLM's sampling distribution is from the trainer's: GRPO's importance-sampling metrics (TRL's), per step,
for a few GRPO steps with `use_vllm` on the tiny test model in fp32.

    .venv-vllm/bin/python scripts/vllm_sampling_mismatch.py [--temperature 0.7] [--top-k 0]

Run in the vLLM virtualenv (`make .venv-vllm/.installed`) with VLLM_CPU_KVCACHE_SPACE=1 on a CPU. Prints one line
per step: |log pi_old - log pi_vllm| per token (mean, max) and the weights pi_old / pi_vllm (min, mean, max).
"""

import argparse
import tempfile


def odd_length(completions, **kwargs):
    return [float(len(c[0]["content"]) % 2) for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=0, help="0: no top-k")
    options = parser.parse_args()
    temperature, top_k = options.temperature, options.top_k
    # Imported after the arguments, so `--help` answers without loading torch.
    from datasets import Dataset

    from a2po import GRPOConfig, GRPOTrainer
    from a2po.testing import make_tiny_model

    folder = tempfile.mkdtemp()
    make_tiny_model(folder, num_heads=2, num_kv_heads=1)  # vLLM's CPU attention needs heads of 32 or more
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i} + {i} ="}]} for i in range(16)])
    args = GRPOConfig(output_dir=f"{folder}/out", per_device_train_batch_size=8, num_generations=4, max_steps=4,
                      max_completion_length=16, temperature=temperature, top_k=top_k, learning_rate=1e-2, seed=0,
                      use_vllm=True, vllm_max_model_length=256, use_cpu=True, gradient_checkpointing=False,
                      logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = GRPOTrainer(folder, odd_length, args=args, train_dataset=prompts)
    trainer.train()
    for log in trainer.state.log_history:
        if "loss" in log:
            print(log["step"], {k.removeprefix("sampling/"): f"{v:.3g}" for k, v in log.items()
                                if k.startswith("sampling/")})


if __name__ == "__main__":
    main()
