"""`A2POTrainer`: A*-PO on top of `transformers.Trainer`. The math is in `a2po.core`, decoding in `a2po.rollout`.

Read top to bottom: set-up, prompts and rewards, stage 1 (`estimate_optimal_values`), stage 2 (`compute_loss`),
evaluation (greedy accuracy plus the regression loss), logging.
"""

from __future__ import annotations

import copy
import functools
import gc
import hashlib
import json
import math
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    set_seed,
)

from a2po.callbacks import StageInterrupted, TimedCheckpoints
from a2po.config import A2POConfig
from a2po.core import a2po_loss, completion_mask
from a2po.data import prompt_question
from a2po.faults import fault_point
from a2po.rollout import sample_completions, sequence_logprobs
from a2po.values import (
    CORRECT_THRESHOLD,
    known_value_record,
    load_optimal_values,
    prompt_id_for,
    read_jsonl,
    rescore,
    summarize,
    value_record,
)

RewardFunc = Callable[..., list[float]]


def frozen_gc(method: Callable) -> Callable:
    """Run `method` with the objects alive at its start exempt from Python's cyclic garbage collector.

    A process that has imported torch, transformers and datasets holds millions of objects, and each full
    collection scans them all: ~0.2 s a time on a laptop-class CPU, several times an epoch, for nothing, since those
    objects live until the end. Objects created during the call are collected as usual.
    """
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if gc.get_freeze_count():  # already inside a frozen call
            return method(*args, **kwargs)
        gc.freeze()
        try:
            return method(*args, **kwargs)
        finally:
            gc.unfreeze()
    return wrapper


class A2POTrainer(Trainer):
    """Trainer for A*-PO (optimal advantage regression), arXiv 2505.20686.

    Stage 1, before training: for every prompt, sample `num_value_samples` completions from the reference policy,
    score them with `reward_funcs`, and estimate V*(x) = beta1 * log(mean_i exp(r_i / beta1)); prompts no sample
    solved are dropped (`filter_all_incorrect`). Stage 2: one completion per prompt from the current policy; the loss
    is (beta2 * log(pi(y|x) / pi_ref(y|x)) - (r(x, y) - V*(x)))^2, averaged over the batch.

    Args:
        model: a model, a hub id or local path, or "SmolLM2-135M-Instruct" (the offline default, `a2po.models`).
        reward_funcs: one function or a list; each gets `prompts`, `completions` and every other dataset column as
            keyword arguments and returns one float per completion. Their weighted sum is r, assumed in {0, 1}.
        args: an `A2POConfig`.
        train_dataset: prompts in a "prompt" column (text, or conversational message lists). A `v_star` column
            skips stage 1 for its non-null rows; a `prompt_id` column names rows (else a hash of the row is used).
        eval_dataset: a Dataset or a dict of Datasets; `evaluate()` reports greedy accuracy on it.
        processing_class: the tokenizer (loaded from `model` when omitted).
        callbacks: `TrainerCallback`s; `a2po.A2POCallback`s also receive the stage-1 and sample events.
        optimizers: (optimizer, scheduler), as in `Trainer`.
        peft_config: a `peft` config (e.g. `LoraConfig`): only adapters train and the reference policy is the same
            weights with adapters disabled, so no second copy of the model is held.
    """

    _tag_names = ["a2po"]

    def __init__(self, model: PreTrainedModel | str, reward_funcs: RewardFunc | list[RewardFunc],
                 args: A2POConfig | None = None, train_dataset: Dataset | None = None,
                 eval_dataset: Dataset | dict[str, Dataset] | None = None,
                 processing_class: PreTrainedTokenizerBase | None = None, callbacks=None,
                 optimizers=(None, None), peft_config=None):
        model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        if args is None:
            args = A2POConfig(output_dir=f"{Path(model_id).name}-A2PO")
        if isinstance(model, str):
            from a2po.models import resolve_model

            model_path = resolve_model(model)
            init_kwargs = dict(args.model_init_kwargs or {})
            init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
            model = AutoModelForCausalLM.from_pretrained(model_path, **init_kwargs)
        else:
            model_path = model_id
        if processing_class is None:
            revision = (args.model_init_kwargs or {}).get("revision")
            processing_class = AutoTokenizer.from_pretrained(model_path, revision=revision,
                                                             trust_remote_code=args.trust_remote_code)
        if processing_class.pad_token is None:
            processing_class.pad_token = processing_class.eos_token
        processing_class.padding_side = "left"
        self.model_id = model_id

        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise TypeError("reward_funcs must be a callable or a non-empty list of callables "
                            "f(prompts, completions, **columns) -> list[float].")
        self.reward_names = [getattr(f, "__name__", f"reward_{i}") for i, f in enumerate(self.reward_funcs)]
        weights = args.reward_weights if args.reward_weights is not None else [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(weights)} values but there are {len(self.reward_funcs)} "
                             "reward functions; give one weight per function (or None for 1.0 each).")
        self.reward_weights = torch.tensor(weights, dtype=torch.float64)

        self.use_peft = peft_config is not None
        if self.use_peft:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
            if args.gradient_checkpointing:
                model.enable_input_require_grads()
            self.ref_model = None
        else:
            # A frozen copy; in bf16 runs it is kept in bf16, half the memory of an fp32 copy.
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            if args.bf16:
                self.ref_model.to(torch.bfloat16)

        gen_config = getattr(model, "generation_config", None)
        eos = getattr(gen_config, "eos_token_id", None) or processing_class.eos_token_id
        self.eos_token_ids = sorted({*([eos] if isinstance(eos, int) else eos), processing_class.eos_token_id})
        self.pad_token_id = processing_class.pad_token_id

        super().__init__(model=model, args=args, data_collator=_identity_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers)
        self.loss_is_scaled_for_ga = False  # our loss is a per-batch mean: Trainer divides by the accumulation steps
        if getattr(self, "is_fsdp_enabled", False):
            warnings.warn("A2POTrainer has not been tested under FSDP (only DDP, and single processes): sampling "
                          "runs on the unwrapped model, and each process may stop decoding at another step.",
                          stacklevel=2)
        if args.save_every_seconds:
            self.add_callback(TimedCheckpoints(args.save_every_seconds))
        if self.ref_model is not None:
            self.ref_model.to(self.accelerator.device)
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._warned_non_binary = False
        self.value_tables: dict[str, Dataset] = {}
        self._known_values: dict[str, dict[str, dict[str, Any]]] = {}
        # Time and work spent decoding, per phase ("values", "train", "eval"): for benchmarks and users alike.
        self.rollout_stats: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    # ----------------------------------------------------------------------------------------------------------
    # Prompts, completions and rewards

    def _render_prompt(self, prompt: Any) -> str:
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
            return self.processing_class.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        raise TypeError(f"A prompt must be a string or a list of {{'role', 'content'}} messages, got {prompt!r:.80}.")

    def _encode_prompts(self, prompts: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Left-padded prompt ids; prompts longer than `max_prompt_length` keep their last tokens, so the generation
        prompt (the end of a chat template) is never cut."""
        texts = [self._render_prompt(p) for p in prompts]
        encoded = [self.processing_class(t, add_special_tokens=isinstance(p, str))["input_ids"]
                   for t, p in zip(texts, prompts)]
        limit = self.args.max_prompt_length
        if limit is not None:
            encoded = [ids[-limit:] for ids in encoded]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, ids in enumerate(encoded):
            if ids:
                input_ids[i, width - len(ids):] = torch.tensor(ids)
                attention_mask[i, width - len(ids):] = 1
        device = self.accelerator.device
        return input_ids.to(device), attention_mask.to(device), texts

    def _decode(self, completion_ids: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        mask = completion_mask(completion_ids, self.eos_token_ids)
        texts = self.processing_class.batch_decode(completion_ids * mask + self.pad_token_id * (1 - mask),
                                                   skip_special_tokens=True)
        return texts, mask

    def _score(self, rows: Sequence[dict[str, Any]], completions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted sum of the reward functions, (len(rows),), and each function's rewards, (len(rows), F)."""
        prompts = [row["prompt"] for row in rows]
        conversational = [not isinstance(p, str) for p in prompts]
        as_given = [[{"role": "assistant", "content": c}] if conv else c
                    for c, conv in zip(completions, conversational)]
        columns = {key: [row.get(key) for row in rows] for key in rows[0] if key not in ("prompt", "completions")}
        per_func = torch.zeros(len(rows), len(self.reward_funcs), dtype=torch.float64)
        for j, (func, name) in enumerate(zip(self.reward_funcs, self.reward_names)):
            try:
                values = func(prompts=prompts, completions=as_given, **columns)
            except Exception as error:
                raise RuntimeError(f"Reward function '{name}' raised {type(error).__name__}: {error}") from error
            if values is None or len(values) != len(rows):
                got = "None" if values is None else f"{len(values)} values"
                raise ValueError(f"Reward function '{name}' returned {got} for {len(rows)} completions; it must "
                                 "return one float per completion.")
            if any(v is None for v in values):
                raise ValueError(f"Reward function '{name}' returned None for some completions; return 0.0 for "
                                 "completions it cannot score.")
            per_func[:, j] = torch.tensor([float(v) for v in values], dtype=torch.float64)
        total = per_func @ self.reward_weights
        if not self._warned_non_binary and not torch.isin(total, torch.tensor([0.0, 1.0], dtype=total.dtype)).all():
            self._warned_non_binary = True
            example = total[~torch.isin(total, torch.tensor([0.0, 1.0], dtype=total.dtype))][0]
            warnings.warn(f"Rewards outside {{0, 1}} (e.g. {example:.3g}): A*-PO assumes binary rewards; V* and the "
                          "filter treat only r = 1 as correct.", stacklevel=2)
        return total, per_func

    @contextmanager
    def _reference_policy(self) -> Iterator[torch.nn.Module]:
        """The frozen reference policy: the copy, or in LoRA mode the same weights with adapters disabled."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        model = self.accelerator.unwrap_model(self.model)
        with model.disable_adapter():
            yield model

    def _stream_keys(self, phase: str, rows: Sequence[dict[str, Any]], num_samples: int = 1) -> list[tuple]:
        """One random-stream key per sampled sequence: a sequence's tokens depend on the run seed, the phase, the
        prompt id, the sample index and (stage 2, evaluation) the step, and on nothing else, so batching, shards,
        interruptions and what ran before change no sample (see `a2po.rollout`)."""
        step = 0 if phase == "values" else self.state.global_step + (phase == "train")
        return [(self.args.seed, phase, step, str(row["prompt_id"]), j) for row in rows for j in range(num_samples)]

    def _sample(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                num_samples: int = 1, greedy: bool = False, phase: str = "train",
                row_keys: Sequence[tuple] | None = None, greedy_samples: int = 0) -> torch.Tensor:
        args = self.args
        autocast = (torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16) if args.bf16
                    else nullcontext())
        start = time.perf_counter()
        with autocast:
            out = sample_completions(model, prompt_ids, prompt_mask, max_new_tokens=args.max_completion_length,
                                     eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
                                     num_samples=num_samples, do_sample=not greedy, temperature=args.temperature,
                                     top_k=args.top_k, top_p=args.top_p, row_keys=None if greedy else row_keys,
                                     greedy_samples=greedy_samples)
        if out.is_cuda:
            torch.cuda.synchronize()
        stats = self.rollout_stats[phase]
        stats["seconds"] += time.perf_counter() - start
        stats["decode_steps"] += out.shape[1]
        stats["sequences"] += out.shape[0]
        stats["tokens"] += int(completion_mask(out, self.eos_token_ids).sum())
        return out

    def _notify(self, event: str, **kwargs) -> None:
        for callback in self.callback_handler.callbacks:
            handler = getattr(callback, event, None)
            if handler is not None:
                result = handler(self.args, self.state, self.control, **kwargs)
                if result is not None:
                    self.control = result

    def _agree_on_control(self, *names: str) -> None:
        """Under several processes, set each of the `control` flags `names` on every rank when any rank's
        callbacks set it: a stop asked on the main process (a dashboard's), a checkpoint due by one rank's clock
        (`TimedCheckpoints`) then happen at the same batch or step everywhere, and the collectives inside logging,
        evaluation and saving are joined by every rank."""
        if self.accelerator.num_processes == 1:
            return
        names = names or ("should_training_stop", "should_save", "should_log", "should_evaluate")
        local = torch.tensor([float(getattr(self.control, name)) for name in names], device=self.accelerator.device)
        agreed = self.accelerator.gather(local[None]).amax(0).tolist()
        for name, value in zip(names, agreed):
            setattr(self.control, name, bool(value))

    def _maybe_log_save_evaluate(self, *args, **kwargs):
        # Right after `on_step_end` (and `on_epoch_end`) and before the Trainer acts on the flags they set.
        self._agree_on_control()
        return super()._maybe_log_save_evaluate(*args, **kwargs)

    # ----------------------------------------------------------------------------------------------------------
    # Stage 1: offline value estimation

    def value_fingerprint(self) -> str:
        """What the stage-1 samples depend on (not beta1: V* is recomputed from the stored rewards)."""
        a = self.args
        key = {"model": str(self.model_id), "rewards": self.reward_names, "weights": self.reward_weights.tolist(),
               "seed": a.seed,
               "n": a.num_value_samples, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
               "max_prompt_length": a.max_prompt_length, "max_completion_length": a.max_completion_length}
        return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    def _values_cache_path(self, split: str) -> Path | None:
        if not self.args.save_values or not self.args.output_dir:
            return None
        rank = f".rank{self.accelerator.process_index}" if self.accelerator.num_processes > 1 else ""
        return Path(self.args.output_dir) / f"optimal_values-{split}-{self.value_fingerprint()}{rank}.jsonl"

    def set_optimal_values(self, records: Dataset | Sequence[dict[str, Any]], split: str = "train") -> None:
        """Give stage 1 rows it already has (e.g. from a database), with their rewards and completions: those
        prompts are not sampled again, and V* is recomputed from the rewards with this run's beta1."""
        rows = records.to_list() if isinstance(records, Dataset) else list(records)
        self._known_values.setdefault(split, {}).update({row["prompt_id"]: row for row in rows})

    def _stored_values(self, split: str) -> dict[str, dict[str, Any]]:
        """V* rows already known from `set_optimal_values`, `values_path` or this run's cache files, by prompt id."""
        found: dict[str, dict[str, Any]] = dict(self._known_values.get(split, {}))
        if self.args.values_path:
            for row in load_optimal_values(self.args.values_path).to_list():
                found[row["prompt_id"]] = row
        cache = self._values_cache_path(split)
        if cache is not None:
            for path in sorted(cache.parent.glob(f"optimal_values-{split}-{self.value_fingerprint()}*.jsonl")):
                for row in read_jsonl(path):
                    found[row["prompt_id"]] = row
        return found

    @frozen_gc
    def estimate_optimal_values(self, dataset: Dataset | None = None, split: str = "train") -> Dataset:
        """Stage 1: the V* table (see `a2po.values.VALUE_COLUMNS`) for `dataset` (default: the train set).

        Rows with a `v_star` value, or already in `values_path` or this run's saved table, are not sampled again.
        Under several processes each samples its shard and every process gets the whole table.
        """
        args = self.args
        if dataset is None:
            dataset = self.train_dataset if split == "train" else self.eval_sets().get(split)
        if dataset is None:
            raise ValueError(f"No dataset for split '{split}': pass train_dataset (or eval_dataset) to A2POTrainer.")
        if "prompt" not in dataset.column_names:
            raise ValueError(f"The {split} dataset has no 'prompt' column (it has {dataset.column_names}); rename "
                             "the column holding the prompts to 'prompt'.")
        rows = dataset.to_list()
        ids = [prompt_id_for(row) for row in rows]
        stored = self._stored_values(split)
        # Every rank must see the same stored rows before any rank appends new ones, or the shards would differ.
        self.accelerator.wait_for_everyone()
        records: dict[str, dict[str, Any]] = {}
        pending = []
        for pid, row in zip(ids, rows):
            if row.get("v_star") is not None:
                records[pid] = known_value_record(pid, row["prompt"], self._render_prompt(row["prompt"]),
                                                  row["v_star"], args.filter_all_incorrect)
            elif pid in stored:
                given = {"prompt": row["prompt"], "prompt_text": self._render_prompt(row["prompt"]), **stored[pid]}
                records[pid] = rescore(given, args.beta1, args.filter_all_incorrect)
            elif pid not in records:
                records[pid] = None  # placeholder keeps duplicate rows from being sampled twice
                pending.append((pid, row))
        # A stop already pending (e.g. the end of training) is not a stop request for this stage.
        stop_before, self.control.should_training_stop = self.control.should_training_stop, False
        self._notify("on_values_begin", split=split, num_prompts=len(rows), num_pending=len(pending))

        started = time.perf_counter()
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = pending[rank::world]
        # Similar lengths in a batch waste less padding.
        mine.sort(key=lambda item: len(self._render_prompt(item[1]["prompt"])))
        batch_size = args.stage1_batch_size
        cache_path = self._values_cache_path(split)
        done = len(rows) - len(pending)
        new_records = []
        bar = tqdm(total=len(pending), desc=f"Stage 1: V* ({split})", unit="prompt",
                   disable=not self.is_local_process_zero() or args.disable_tqdm)
        # Every rank runs as many batches as the largest shard (the first) needs, with an empty batch once its own
        # shard is done: each batch ends in collectives (records gathered, the stop agreed) that every rank joins.
        num_batches = -(-len(pending[0::world]) // batch_size)
        with self._reference_policy() as reference:
            for start in range(0, num_batches * batch_size, batch_size):
                batch = mine[start:start + batch_size]
                batch_records = []
                if batch:
                    batch_rows = [{**row, "prompt_id": pid} for pid, row in batch]
                    prompt_ids, prompt_mask, texts = self._encode_prompts([row["prompt"] for row in batch_rows])
                    completion_ids = self._sample(reference, prompt_ids, prompt_mask,
                                                  num_samples=args.num_value_samples, phase="values",
                                                  row_keys=self._stream_keys("values", batch_rows,
                                                                             args.num_value_samples))
                    completions, _ = self._decode(completion_ids)
                    n = args.num_value_samples
                    repeated = [row for row in batch_rows for _ in range(n)]
                    rewards, _ = self._score(repeated, completions)
                    fault_point("values_batch")
                    batch_records = [
                        value_record(pid, row["prompt"], texts[i], rewards[i * n:(i + 1) * n].tolist(),
                                     completions[i * n:(i + 1) * n], args.beta1, args.filter_all_incorrect)
                        for i, (pid, row) in enumerate(batch)]
                if cache_path is not None and batch_records:
                    cache_path.parent.mkdir(parents=True, exist_ok=True)
                    with open(cache_path, "a", encoding="utf-8") as f:
                        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in batch_records)
                if world > 1:  # the callbacks of every rank (the main one stores them) see every rank's rows
                    batch_records = gather_object(batch_records)
                new_records.extend(batch_records)
                done += len(batch_records)
                bar.update(len(batch_records))
                self._notify("on_values_batch", split=split, records=batch_records, done=done, total=len(rows))
                self._agree_on_control("should_training_stop")
                if self.control.should_training_stop:
                    bar.close()
                    raise StageInterrupted(f"Stage 1 ({split}) stopped after {done} of {len(rows)} prompts; "
                                           "rerun to continue with the prompts not yet done.")
        bar.close()
        self.control.should_training_stop = stop_before
        for record in new_records:
            records[record["prompt_id"]] = record
        table_rows = [records[pid] for pid in dict.fromkeys(ids)]
        table = Dataset.from_list(table_rows)
        summary = summarize(table_rows, args.num_value_samples)
        summary["runtime"] = round(time.perf_counter() - started, 4)
        self.value_tables[split] = table
        self._notify("on_values_end", split=split, values=table, summary=summary)
        self.log({f"values/{split}/{k}": float(v) for k, v in summary.items()})
        return table

    def _with_values(self, dataset: Dataset, split: str, drop_filtered: bool) -> Dataset:
        table = self.value_tables.get(split) or self.estimate_optimal_values(dataset, split)
        by_id = {row["prompt_id"]: row for row in table.to_list()}
        keep, v_stars, pids = [], [], []
        for i, row in enumerate(dataset.to_list()):
            record = by_id[prompt_id_for(row)]
            if drop_filtered and record["filtered"]:
                continue
            keep.append(i)
            v_stars.append(record["v_star"])
            pids.append(record["prompt_id"])
        out = dataset.select(keep)
        if self.args.remove_unused_columns:
            out = out.select_columns(["prompt"])
        out = out.remove_columns([c for c in ("v_star", "prompt_id") if c in out.column_names])
        return out.add_column("prompt_id", pids).add_column("v_star", v_stars)

    @frozen_gc
    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None,
              **kwargs):
        """Stage 1 (unless every prompt already has V*), then stage 2 through `Trainer.train`.

        After stage 1 `self.train_dataset` holds the kept prompts (with their `prompt_id` and `v_star` columns) and
        keeps them after training, as TRL's trainer does: `len(trainer.train_dataset)` is the number of prompts stage 2
        trained on in both. A second call (or a resume) finds them all in the V* table and trains on the same rows.
        """
        if self.train_dataset is None:
            raise ValueError("A2POTrainer.train() needs a train_dataset with a 'prompt' column.")
        trained_on = self._with_values(self.train_dataset, "train", drop_filtered=self.args.filter_all_incorrect)
        if len(trained_on) == 0:
            raise ValueError("Every training prompt was filtered out: no reference sample was correct. Use easier "
                             "prompts, more num_value_samples, a higher temperature, or filter_all_incorrect=False.")
        self.train_dataset = trained_on
        # Stage 2 starts from the run seed whether stage 1 sampled, resumed or was read from a store (a resumed run
        # then takes the generator states of its checkpoint).
        set_seed(self.args.seed)
        # The step-0 evaluation (`eval_on_start`) measures the model before training: a resumed run had it already.
        eval_on_start = self.args.eval_on_start
        self.args.eval_on_start = eval_on_start and not resume_from_checkpoint
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        finally:
            self.args.eval_on_start = eval_on_start

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if _internal_call:  # inside a checkpoint: its optimizer, scheduler, RNG and trainer state come next
            fault_point("checkpoint")

    # ----------------------------------------------------------------------------------------------------------
    # Stage 2: on-policy regression

    def _rollout_and_score(self, model: torch.nn.Module, rows: Sequence[dict[str, Any]], greedy: bool = False,
                           phase: str = "train"):
        policy = self.accelerator.unwrap_model(model)
        prompt_ids, prompt_mask, texts = self._encode_prompts([row["prompt"] for row in rows])
        completion_ids = self._sample(policy, prompt_ids, prompt_mask, greedy=greedy, phase=phase,
                                      row_keys=None if greedy else self._stream_keys(phase, rows))
        completions, mask = self._decode(completion_ids)
        rewards, per_func = self._score(rows, completions)
        return prompt_ids, prompt_mask, texts, completion_ids, mask, completions, rewards, per_func

    def _regression(self, model, rows, prompt_ids, prompt_mask, completion_ids, mask, rewards):
        # Reference first: its temporaries are freed before the policy's autograd graph exists.
        with torch.no_grad(), self._reference_policy() as reference:
            ref_logps = sequence_logprobs(reference, prompt_ids, prompt_mask, completion_ids, mask)
        policy_logps = sequence_logprobs(model, prompt_ids, prompt_mask, completion_ids, mask)
        v_star = torch.tensor([row["v_star"] for row in rows], device=policy_logps.device)
        return a2po_loss(policy_logps, ref_logps, rewards.to(policy_logps.device, policy_logps.dtype),
                         v_star.to(policy_logps.dtype), self.args.beta2)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        rows = inputs
        (prompt_ids, prompt_mask, texts, completion_ids, mask, completions, rewards,
         per_func) = self._rollout_and_score(model, rows)
        fault_point("train_step")
        loss, stats = self._regression(model, rows, prompt_ids, prompt_mask, completion_ids, mask, rewards)
        lengths = mask.sum(-1).float()
        clipped = ~(torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=completion_ids.device))
                    .any(-1))
        v_star = torch.tensor([row["v_star"] for row in rows], dtype=torch.float64)
        m = self._metrics
        m["reward"].append(rewards.mean().item())
        m["reward_std"].append(rewards.std().item() if len(rows) > 1 else 0.0)
        m["accuracy"].append((rewards >= CORRECT_THRESHOLD).double().mean().item())
        m["v_star"].append(v_star.mean().item())
        m["advantage"].append(stats["advantage"].mean().item())
        m["implicit_reward"].append(stats["implicit_reward"].mean().item())
        m["log_ratio"].append(stats["log_ratio"].mean().item())
        m["completion_length"].append(lengths.mean().item())
        m["completion_clipped_frac"].append(clipped.float().mean().item())
        for j, name in enumerate(self.reward_names):
            m[f"rewards/{name}"].append(per_func[:, j].mean().item())
        step = self.state.global_step + 1
        samples = [
            {"step": step, "split": "train", "prompt_id": row["prompt_id"], "prompt_text": texts[i],
             "question": prompt_question(row["prompt"]),
             "completion": completions[i], "reward": float(rewards[i]), "v_star": float(row["v_star"]),
             "advantage": float(stats["advantage"][i]), "implicit_reward": float(stats["implicit_reward"][i]),
             "completion_length": int(lengths[i])} for i, row in enumerate(rows)]
        if self.accelerator.num_processes > 1:  # every rank computes the loss equally often: a safe collective
            samples = gather_object(samples)
        self._notify("on_samples", samples=samples)
        return (loss, {}) if return_outputs else loss

    # ----------------------------------------------------------------------------------------------------------
    # Evaluation

    def eval_sets(self, eval_dataset=None) -> dict[str, Dataset]:
        """Eval datasets by the split name used in V* tables and metrics: "eval", or "eval_<name>" for a dict."""
        eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(eval_dataset, str):
            return {f"eval_{eval_dataset}": self.eval_dataset[eval_dataset]}
        if isinstance(eval_dataset, dict):
            return {f"eval_{name}": ds for name, ds in eval_dataset.items()}
        return {} if eval_dataset is None else {"eval": eval_dataset}

    def evaluate(self, eval_dataset: Dataset | dict[str, Dataset] | str | None = None, ignore_keys=None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Greedy accuracy (pass@1, the number users care about), plus the regression loss on one sampled completion
        per prompt against its V* (estimated from the reference policy on first use), and the reference pass@N.
        A prompt's greedy and sampled completions come from one decode; before the first update the policy is the
        reference, so the loss is (r - V*)^2 with no forward pass."""
        sets = self.eval_sets(eval_dataset)
        if not sets:
            raise ValueError("evaluate() needs an eval_dataset (here or in A2POTrainer(eval_dataset=...)).")
        metrics: dict[str, float] = {}
        start = time.time()
        for split, dataset in sets.items():
            prefix = metric_key_prefix if split == "eval" else f"{metric_key_prefix}_{split[len('eval_'):]}"
            with_values = self._with_values(dataset, split, drop_filtered=False)
            metrics.update(self._evaluate_split(with_values, split, prefix))
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _policy_is_reference(self) -> bool:
        """Whether the policy still equals the reference: before the first optimizer step, the reference being a copy
        of the model given (or, with LoRA, that model with its fresh, zero-effect adapters off)."""
        return self.state.global_step == 0

    @torch.no_grad()
    def _evaluate_split(self, dataset: Dataset, split: str, prefix: str) -> dict[str, float]:
        rows = dataset.to_list()
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = rows[rank::world]
        batch_size = self.args.per_device_eval_batch_size
        results, samples = [], []
        policy = self.accelerator.unwrap_model(self.model)
        for start in range(0, len(mine), batch_size):
            batch = mine[start:start + batch_size]
            prompt_ids, prompt_mask, texts = self._encode_prompts([row["prompt"] for row in batch])
            # Each prompt's greedy answer (accuracy) and one sample (the loss), in one decode: the prompts are
            # prefilled once, and a CPU decode step reads the weights once for both rows.
            keys = [key for sampled in self._stream_keys("eval", batch) for key in (("greedy", *sampled), sampled)]
            both = self._sample(policy, prompt_ids, prompt_mask, num_samples=2, phase="eval", row_keys=keys,
                                greedy_samples=1)
            greedy_completions, greedy_mask = self._decode(both[0::2])
            greedy_rewards, _ = self._score(batch, greedy_completions)
            completion_ids = both[1::2]
            completions, mask = self._decode(completion_ids)
            rewards, _ = self._score(batch, completions)
            if self._policy_is_reference():
                # log pi/pi_ref = 0 for every completion: the loss needs no forward pass.
                zeros = torch.zeros(len(batch), dtype=torch.float64)
                v_star = torch.tensor([row["v_star"] for row in batch], dtype=torch.float64)
                _, stats = a2po_loss(zeros, zeros, rewards.double(), v_star, self.args.beta2)
            else:
                _, stats = self._regression(self.model, batch, prompt_ids, prompt_mask, completion_ids, mask,
                                            rewards)
            # Per-row squared errors, so the mean over all rows is exact whatever the batching.
            loss_terms = ((stats["implicit_reward"] - stats["advantage"]) ** 2).tolist()
            for i, row in enumerate(batch):
                results.append({"correct": float(greedy_rewards[i] >= CORRECT_THRESHOLD),
                                "reward": float(greedy_rewards[i]), "loss": loss_terms[i],
                                "length": float(greedy_mask[i].sum()), "task": row.get("task")})
                samples.append({"step": self.state.global_step, "split": split, "prompt_id": row["prompt_id"],
                                "prompt_text": texts[i], "question": prompt_question(row["prompt"]),
                                "completion": greedy_completions[i],
                                "reward": float(greedy_rewards[i]), "v_star": float(row["v_star"]),
                                "advantage": float(greedy_rewards[i]) - float(row["v_star"]),
                                "implicit_reward": None, "completion_length": int(greedy_mask[i].sum())})
        if world > 1:
            results, samples = gather_object(results), gather_object(samples)
        self._notify("on_samples", samples=samples)
        n = max(len(results), 1)
        out = {f"{prefix}_accuracy": sum(r["correct"] for r in results) / n,
               f"{prefix}_reward": sum(r["reward"] for r in results) / n,
               f"{prefix}_loss": sum(r["loss"] for r in results) / n,
               f"{prefix}_completion_length": sum(r["length"] for r in results) / n,
               f"{prefix}_v_star": sum(row["v_star"] for row in rows) / max(len(rows), 1)}
        # A mix of tasks (a `task` column, e.g. reasoning-gym mixes): accuracy per task too.
        tasks = sorted({r["task"] for r in results if isinstance(r["task"], str)})
        if len(tasks) > 1:
            for task in tasks:
                correct = [r["correct"] for r in results if r["task"] == task]
                out[f"{prefix}_accuracy/{task}"] = sum(correct) / len(correct)
        summary = summarize(self.value_tables[split].to_list(), self.args.num_value_samples)
        if "pass_at_n" in summary:
            out[f"{prefix}_ref_pass_at_1"] = summary["pass_at_1"]
            out[f"{prefix}_ref_pass_at_n"] = summary["pass_at_n"]
        return out

    # ----------------------------------------------------------------------------------------------------------
    # Logging

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self._metrics and "loss" in logs:
            averaged = {k: sum(v) / len(v) for k, v in self._metrics.items()}
            if self.accelerator.num_processes > 1:
                names = sorted(averaged)
                local = torch.tensor([averaged[k] for k in names], device=self.accelerator.device)
                averaged = dict(zip(names, self.accelerator.gather(local[None]).mean(0).tolist()))
            logs = {**logs, **averaged}
            self._metrics.clear()
        logs = {k: (v if not isinstance(v, float) or math.isfinite(v) else float("nan")) for k, v in logs.items()}
        super().log(logs, start_time)


def _identity_collator(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows
