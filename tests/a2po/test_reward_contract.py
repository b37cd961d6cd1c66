"""TRL 1.16's reward contract (`a2po.rewards.call_rewards`; README, "rewards"): a reward function written for TRL's
GRPOTrainer (`completion_ids`, `trainer_state`, `log_extra`, `log_metric`, `async`, None for "not applicable")
trains unchanged with A2POTrainer and GRPOTrainer, through the CLI and in the studio's worker; its metric is logged
under the name it gives (as TRL logs it), its columns travel with the samples, and `completion_ids` are the tokens
TRL's own code passes for the same generation."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from gradio_client import Client
from transformers import TrainerCallback, TrainerState

from a2po import A2POConfig, A2POTrainer, GRPOConfig, GRPOTrainer
from a2po.base_trainer import completion_token_lists
from a2po.rewards import call_rewards
from app.web import charts
from app.web.pages.run.builders import training_view
from app.web.pages.run.frame import ChartOptions
from storage import Store
from tests.a2po.test_registered_rewards import TINY_RUN, cli, write
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app, tiny_spec

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


TRL_REWARDS = '''
"""Rewards written for TRL 1.16's GRPOTrainer, used here unchanged."""
import asyncio


def token_count_check(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **kwargs):
    """1.0 where the completion is over 3 tokens, on even rows; None (does not apply) on odd rows."""
    if len(completion_ids) != len(completions) or not all(isinstance(t, int) for ids in completion_ids for t in ids):
        raise TypeError("completion_ids must hold one list of token ids per completion")
    if not hasattr(trainer_state, "global_step"):
        raise TypeError(f"trainer_state is {trainer_state!r}")
    counts = [len(ids) for ids in completion_ids]
    log_extra("num_tokens", counts)
    log_metric("mean_tokens", sum(counts) / len(counts))
    return [float(n > 3) if i % 2 == 0 else None for i, n in enumerate(counts)]


async def async_judge(completions, **kwargs):
    """A stand-in for an async call to a judge: 1.0 where the completion holds a digit."""
    await asyncio.sleep(0.01)
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(any(ch.isdigit() for ch in text)) for text in texts]
'''
PROMPTS = [{"prompt": [{"role": "user", "content": f"{a} + {a} ="}], "ground_truth": str(2 * a)} for a in range(4)]
SMALL = dict(max_completion_length=6, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
             gradient_checkpointing=False, logging_steps=1, max_steps=2)


def load_rewards(folder: Path) -> list:
    path = write(folder / "trl_rewards.py", TRL_REWARDS)
    spec = importlib.util.spec_from_file_location("trl_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [module.token_count_check, module.async_judge]


class Samples(TrainerCallback):
    """The samples and every log (stage 1's too, which `Trainer.train`'s new state does not keep)."""

    def __init__(self) -> None:
        self.samples: list[dict] = []
        self.logs: list[dict] = []

    def on_samples(self, args, state, control, samples, **kwargs):
        self.samples.extend(samples)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def check_logged(trainer, seen: Samples) -> None:
    """Each training log's `mean_tokens` is the mean token count of that step's completions, which `log_extra` gave
    each sample; the evaluation logs `eval_mean_tokens`. The Run page tells it from the trainer's own metrics."""
    samples = seen.samples
    train = [s for s in samples if s["split"] == "train"]
    assert train and all(s["extra"] == {"num_tokens": s["completion_length"]} for s in train)
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 2
    for log in steps:
        lengths = [s["completion_length"] for s in train if s["step"] == log["step"]]
        assert log["mean_tokens"] == pytest.approx(sum(lengths) / len(lengths))
        assert not math.isnan(log["rewards/token_count_check"]) and not math.isnan(log["rewards/async_judge"])
    evaluations = [log for log in trainer.state.log_history if "eval_accuracy" in log]
    assert evaluations and all(0 < log["eval_mean_tokens"] <= 6 for log in evaluations)
    assert all(s["extra"].keys() == {"num_tokens"} for s in samples if s["split"] == "eval")
    logged = {name for log in seen.logs for name in log}
    assert charts.reward_metric_panels(logged) == [("mean_tokens", "mean_tokens")]


def test_a_trl_reward_trains_a2po_unchanged(tmp_path, tiny_model_dir):
    samples = Samples()
    args = A2POConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_value_samples=2,
                      filter_all_incorrect=False, eval_strategy="steps", eval_steps=2, **SMALL)
    trainer = A2POTrainer(tiny_model_dir, load_rewards(tmp_path), args=args, train_dataset=Dataset.from_list(PROMPTS),
                          eval_dataset=Dataset.from_list(PROMPTS[:2]), callbacks=[samples])
    trainer.train()
    check_logged(trainer, samples)
    # Stage 1's calls log under the stage's prefix: one token-count mean over the reference's samples.
    [values] = [log for log in samples.logs if "values/train/mean_tokens" in log]
    assert 0 < values["values/train/mean_tokens"] <= 6


def test_a_trl_reward_trains_grpo_unchanged(tmp_path, tiny_model_dir):
    samples = Samples()
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      eval_strategy="steps", eval_steps=2, **SMALL)
    trainer = GRPOTrainer(tiny_model_dir, load_rewards(tmp_path), args=args, train_dataset=Dataset.from_list(PROMPTS),
                          eval_dataset=Dataset.from_list(PROMPTS[:2]), callbacks=[samples])
    trainer.train()
    check_logged(trainer, samples)


def test_async_rewards_run_concurrently_on_one_loop_kept_between_calls():
    """Two async functions that each wait for the other finish only when they run at once; the loop is the same for
    every call (a client a judge keeps between calls stays usable), and not the caller's thread."""
    loops, events = [], {}

    def waiting_for(mine: str, other: str):
        async def reward(completions, **kwargs):
            loops.append((asyncio.get_running_loop(), threading.current_thread()))
            events.setdefault(mine, asyncio.Event()).set()
            await asyncio.wait_for(events.setdefault(other, asyncio.Event()).wait(), timeout=60)
            return [1.0] * len(completions)
        return reward

    for _ in range(2):
        events.clear()
        calls = call_rewards([waiting_for("a", "b"), waiting_for("b", "a")], ["a", "b"], ["p"], ["c"], [[5, 1]],
                             {}, TrainerState())
        assert calls.values == [[1.0], [1.0]]
    assert len({id(loop) for loop, _ in loops}) == 1 and loops[0][1] is not threading.current_thread()


def test_log_extra_and_none_follow_trl():
    def partial(completions, log_extra, log_metric, **kwargs):
        log_extra("judge_note", ["ok", "n/a"])
        log_metric("calls", 1.0)
        log_metric("calls", 3.0)
        return [1.0, None]

    calls = call_rewards([partial], ["partial"], ["p", "q"], ["a", "b"], [[1], [2]], {}, TrainerState())
    assert calls.values == [[1.0, None]] and calls.extra_columns == {"judge_note": ["ok", "n/a"]}
    assert calls.metrics == {"calls": 2.0}  # one value per batch: the mean of what the batch logged, as TRL

    def short(completions, log_extra, **kwargs):
        log_extra("judge_note", ["only one"])
        return [1.0, 0.0]

    with pytest.raises(ValueError, match=r"log_extra\('judge_note', \.\.\.\) got 1 values for 2 completions"):
        call_rewards([short], ["short"], ["p", "q"], ["a", "b"], [[1], [2]], {}, TrainerState())

    async def failing(completions, **kwargs):
        raise KeyError("judge down")

    with pytest.raises(RuntimeError, match="Reward function 'failing' raised KeyError: 'judge down'"):
        call_rewards([failing], ["failing"], ["p"], ["a"], [[1]], {}, TrainerState())


def test_completion_ids_are_the_tokens_trl_passes(tmp_path, tiny_model_dir):
    """The same generated tokens (padded after each row's end token, one row never ending, one ending with the
    second EOS id) through TRL 1.16's own `_generate_single_turn` and `_calculate_rewards`, and through ours: every
    reward function gets the same `completion_ids`."""
    trl = pytest.importorskip("trl", reason="TRL is the `bench` extra (`make test` installs it)")
    seen: dict[str, list] = {}

    def record(who):
        def reward(completions, completion_ids, **kwargs):
            seen[who] = completion_ids
            return [0.0] * len(completions)
        reward.__name__ = f"record_{who}"
        return reward

    ours = GRPOTrainer(tiny_model_dir, record("ours"), train_dataset=Dataset.from_list(PROMPTS),
                       args=GRPOConfig(output_dir=str(tmp_path / "ours"), per_device_train_batch_size=4,
                                       num_generations=2, max_completion_length=6, use_cpu=True, report_to="none"))
    tok = ours.processing_class
    eos, end, pad, a = tok.eos_token_id, tok.convert_tokens_to_ids("<|end|>"), tok.pad_token_id, tok.encode("7")[0]
    generated = torch.tensor([[a, a, eos, pad, pad, pad], [a, a, a, a, a, a], [end, pad, pad, pad, pad, pad],
                              [a, end, a, eos, pad, pad]])
    theirs = trl.GRPOTrainer(tiny_model_dir, record("trl"), train_dataset=Dataset.from_list(PROMPTS),
                             processing_class=tok,
                             args=trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4,
                                                 num_generations=2, max_completion_length=6, use_cpu=True,
                                                 report_to="none"))
    theirs.model.generate = lambda input_ids, **kwargs: torch.cat([input_ids, generated], dim=1)
    rows = [dict(row) for row in PROMPTS[:2] for _ in range(2)]
    theirs._generate_and_score_completions(rows)

    completions, mask = ours._decode(generated)
    ours._score(rows, completions, completion_token_lists(generated, mask))
    assert seen["ours"] == seen["trl"] == [[a, a, eos], [a] * 6, [end], [a, end]]


# ----------------------------------------------------------------------------------------------------------------
# The CLI and the studio: the same file, registered


def test_a_trl_reward_trains_through_the_cli(tmp_path, tiny_model_dir):
    path = write(tmp_path / "trl_rewards.py", TRL_REWARDS)
    out = tmp_path / "out"
    result = cli(["train", "--model", tiny_model_dir, "--reward-module", str(path), "--reward", "token_count_check",
                  "async_judge", "--output_dir", str(out), *TINY_RUN, "--eval_strategy", "steps",
                  "--eval_steps", "1"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    for name in ("'mean_tokens'", "'values/eval/mean_tokens'", "'eval_mean_tokens'", "'rewards/async_judge'"):
        assert name in printed, name


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[Client, Path]]:
    root = tmp_path_factory.mktemp("trl-reward-studio")
    path = write(root / "rewards" / "trl_rewards.py", TRL_REWARDS)
    data_dir = root / "data"
    proc = start_app(data_dir, port := free_port(), "--model-root", tiny_model_dir, "--reward-module", str(path))
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False), data_dir
    finally:
        stop_app(proc)


@pytest.mark.parametrize("method", ["a2po", "grpo"])
def test_a_trl_reward_trains_in_the_studio(studio, tiny_model_dir, method):
    client, data_dir = studio
    spec = {**tiny_spec(tiny_model_dir, f"trl-reward-{method}", **({"num_generations": 2} if method == "grpo" else {})),
            "rewards": [{"name": "token_count_check", "weight": 1.0}, {"name": "async_judge", "weight": 1.0}]}
    if method == "grpo":  # without A*-PO's stage-1 settings
        spec["method"] = "grpo"
        spec["config"] = {k: v for k, v in spec["config"].items()
                          if k not in ("num_value_samples", "filter_all_incorrect")}
    run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
    status = wait_for(lambda: (s := client.predict(run_id=run_id, api_name="/status"))["status"]
                      in ("finished", "failed") and s, 600, f"run {run_id} to end")
    assert status["status"] == "finished", status["error"]
    store = Store(data_dir / "studio.db")
    names = {row["name"] for row in store.get_metrics(run_id)}
    assert {"mean_tokens", "eval_mean_tokens"} <= names
    values = [row["value"] for row in store.get_metrics(run_id, names=["mean_tokens"])]
    assert values and all(0 < v <= 8 for v in values)
    # The Run page draws it beside the built-in curves.
    plot = training_view(store, run_id, store.last_ids(run_id), ChartOptions(), {})["plot"].plot
    assert '"mean_tokens"' in plot and '"Loss"' in plot
