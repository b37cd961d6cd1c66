"""The playground's model process (`python -m app.runtime.playground`, started by
`app.runtime.playground.client.PlaygroundClient`): loads the reference and trained policies, decodes, and scores as
the trainers do, with the library's tokenizer set-up, end tokens and weighted reward (`a2po.tokens`,
`a2po.rewards.call_on_rows`); also "Try the reward". docs/api.md, "The playground".
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import select
import sys
import time
import traceback
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, TrainerState

from a2po.answers import extract_final_answer, prompt_question
from a2po.checkpoints import WEIGHT_FILES
from a2po.models import is_default_model, resolve_model
from a2po.reward_registry import get_reward_function
from a2po.rewards import TRAINER_ARGUMENTS, call_on_rows, tasks_of
from a2po.rollout import sample_completions
from a2po.runspec import RunSpec
from a2po.tokens import decode_completions, encode_prompt, end_token_ids, load_tokenizer
from a2po.values import prompt_id_for
from app.runtime.playground.client import KINDS, TRY_MAX_PARAMS, TRY_ROWS


class PlaygroundModels:
    """Loads models (caching the last pair and the last run's data), decodes and scores. Lives in the playground
    process."""

    def __init__(self) -> None:
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._pair_key: tuple | None = None
        self._pair: dict[str, Any] | None = None
        self._data_key: str | None = None
        self._rows: dict[str, dict[str, Any]] = {}
        self._data_error: str | None = None
        self._reward_failure: str | None = None

    # -- loading ------------------------------------------------------------------------------------------------

    @staticmethod
    def _stamp(path: str | None) -> tuple:
        """Modification times of a weights folder's files: a folder rewritten under the same name reloads."""
        if not path:
            return ()
        folder = Path(path)
        return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.name in WEIGHT_FILES)) \
            if folder.is_dir() else ()

    def models(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The (reference, trained) pair of a request, loaded or from the cache; returns (pair, cached)."""
        reference, trained = request["reference"], request.get("trained")
        key = (reference["model"], json.dumps(reference.get("init") or {}, sort_keys=True),
               trained and trained["path"], trained and trained.get("adapter"),
               self._stamp(trained and trained["path"]))
        if key == self._pair_key and self._pair is not None:
            return self._pair, True
        self._pair, self._pair_key = None, None  # free the old pair before loading the new one
        gc.collect()
        self._pair = self._load(reference, trained)
        self._pair_key = key
        return self._pair, False

    def _load(self, reference: dict[str, Any], trained: dict[str, Any] | None) -> dict[str, Any]:
        base_path = resolve_model(reference["model"])
        init = dict(reference.get("init") or {})
        tokenizer = load_tokenizer(base_path, revision=init.get("revision"),
                                   trust_remote_code=bool(init.get("trust_remote_code")))
        base = AutoModelForCausalLM.from_pretrained(base_path, **init).to(self.device).eval()
        pair: dict[str, Any] = {"tokenizer": tokenizer, "reference": base, "trained": None, "adapter": False}
        if trained is not None:
            if not Path(trained["path"]).is_dir():
                raise FileNotFoundError(f"The trained weights {trained['path']} are gone (a newer checkpoint "
                                        "replaced them?): ask again.")
            if trained.get("adapter"):
                from peft import PeftModel  # only a LoRA run needs it: the process starts without it

                pair["trained"] = PeftModel.from_pretrained(base, trained["path"]).to(self.device).eval()
                pair["adapter"] = True
            else:
                init_trained = {k: v for k, v in init.items() if k != "revision"}
                pair["trained"] = AutoModelForCausalLM.from_pretrained(trained["path"], **init_trained)
                pair["trained"].to(self.device).eval()
        for model in (pair["reference"], pair["trained"]):
            if model is not None:
                model.requires_grad_(False)
        pair["eos"] = end_token_ids(base, tokenizer)
        return pair

    def rows(self, dataset: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        """The run's data rows by question (train and eval), built once per dataset spec; {} when it cannot be
        built here (a hub dataset while offline): its prompts are then scored like typed ones."""
        if not dataset:
            return {}
        key = json.dumps(dataset, sort_keys=True, default=str)
        if key == self._data_key:
            return self._rows
        rows: dict[str, dict[str, Any]] = {}
        try:
            train, held_out = RunSpec(dataset=dict(dataset)).build_datasets()
            for part in (train, held_out):
                for row in part.to_list() if part is not None else []:
                    rows.setdefault(prompt_question(row["prompt"]).strip(), row)
            self._data_error = None
        except Exception as error:  # noqa: BLE001 - the playground still answers, unscored
            self._data_error = f"{type(error).__name__}: {error}"
            print(f"playground: could not build the run's dataset: {self._data_error}", file=sys.stderr, flush=True)
        self._data_key, self._rows = key, rows
        return rows

    # -- answering ----------------------------------------------------------------------------------------------

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        pair, cached = self.models(request)
        loaded = time.perf_counter()
        tokenizer = pair["tokenizer"]
        row = self.rows(request.get("dataset")).get(request["prompt"].strip())
        self._reward_failure = None
        if row is not None:
            prompt: Any = row["prompt"]
        elif tokenizer.chat_template:
            prompt = [{"role": "user", "content": request["prompt"]}]
        else:
            prompt = request["prompt"]
        encoded = self._encode(tokenizer, prompt, request.get("max_prompt_length"))
        out: dict[str, Any] = {"reference": [], "trained": []}
        if pair["trained"] is None:
            out["reference"] = self._complete(pair["reference"], pair, encoded, request, prompt, row)
        elif pair["adapter"]:
            with pair["trained"].disable_adapter():
                out["reference"] = self._complete(pair["trained"], pair, encoded, request, prompt, row)
            out["trained"] = self._complete(pair["trained"], pair, encoded, request, prompt, row)
        else:
            out["reference"] = self._complete(pair["reference"], pair, encoded, request, prompt, row)
            out["trained"] = self._complete(pair["trained"], pair, encoded, request, prompt, row)
        done = time.perf_counter()
        unscored = self._unscored_reason(request, row) or self._reward_failure
        out.update(cached=cached, load_seconds=round(loaded - started, 3), generate_seconds=round(done - loaded, 3),
                   matched=row is not None, scored=unscored is None, unscored_reason=unscored,
                   device=str(self.device), threads=torch.get_num_threads(), data_error=self._data_error)
        return out

    def _encode(self, tokenizer, prompt: Any, limit: int | None):
        _, ids = encode_prompt(tokenizer, prompt, int(limit) if limit else None)
        if not ids:
            raise ValueError("The prompt encodes to no tokens.")
        input_ids = torch.tensor([ids], device=self.device)
        return input_ids, torch.ones_like(input_ids)

    def _complete(self, model, pair, encoded, request, prompt, row) -> list[dict[str, Any]]:
        input_ids, mask = encoded
        tokenizer = pair["tokenizer"]
        n = int(request["num_samples"])
        keys = [(request.get("seed", 42), "playground", request["prompt"].strip(), j) for j in range(n)]
        ids = decode_greedy_and_samples(model, input_ids, mask, max_new_tokens=int(request["max_new_tokens"]),
                                        eos_token_ids=pair["eos"], pad_token_id=tokenizer.pad_token_id, row_keys=keys,
                                        temperature=float(request.get("temperature") or 1.0),
                                        top_p=float(request.get("top_p") or 1.0), top_k=request.get("top_k"))
        texts, _ = decode_completions(tokenizer, ids, pair["eos"])
        rewards = self._rewards(request, prompt, row, texts)
        return [{"completion": text, "reward": reward, "greedy": i == 0}
                for i, (text, reward) in enumerate(zip(texts, rewards))]

    # -- trying a reward ----------------------------------------------------------------------------------------

    def try_reward(self, request: dict[str, Any]) -> dict[str, Any]:
        """Score a few of the dataset's first prompts with the request's rewards: each row's answer column (which
        should score 1), a wrong answer (0) and, when the model is small enough, one sample of it. Returns
        {"rows": [{"prompt", "kind", "completion", "reward"}], "error", "note", "model_pid"}; a reward that fails
        is the `error`, not an exception."""
        started = time.perf_counter()
        train, _ = RunSpec(dataset=dict(request["dataset"])).build_datasets()
        rows = train.select(range(min(int(request.get("rows") or TRY_ROWS), len(train)))).to_list()
        if not rows:
            raise ValueError("The dataset has no rows.")
        kinds: list[tuple[str, list[dict[str, Any]], list[str]]] = []
        answered = [r for r in rows if answer_completion(r) is not None]
        if answered:
            kinds.append(("answer", answered, [answer_completion(r) for r in answered]))
            kinds.append(("wrong", answered, [answer_completion(r, wrong=True) for r in answered]))
        notes = []
        if request.get("model"):
            try:
                samples = self._try_samples(request, rows)
            except Exception as error:  # noqa: BLE001 - the answer column is still scored
                samples = None
                notes.append(f"The model was not sampled ({type(error).__name__}: {short_text(str(error), 200)}).")
            if isinstance(samples, str):
                notes.append(samples)
            elif samples is not None:
                kinds.append(("sample", rows, samples))
        out: list[dict[str, Any]] = []
        error = None
        for kind, kind_rows, texts in kinds:
            try:
                scores = score_rows(request["rewards"], kind_rows, texts)
            except Exception as failure:  # noqa: BLE001 - shown as the verdict
                error = f"{failure}"
                break
            out += [{"prompt": prompt_question(r["prompt"]), "kind": KINDS[kind], "completion": t, "reward": v}
                    for r, t, v in zip(kind_rows, texts, scores)]
        return {"rows": out, "error": error, "note": " ".join(notes) or None, "pid": os.getpid(),
                "seconds": round(time.perf_counter() - started, 3)}

    def _try_samples(self, request: dict[str, Any], rows: list[dict[str, Any]]) -> list[str] | str:
        """One sample of the model per row (the run's sampling settings and seed), or why it was not sampled."""
        model_name = request["model"]
        if not is_default_model(model_name):
            config = AutoConfig.from_pretrained(resolve_model(model_name))
            with torch.device("meta"):
                count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if count > float(request.get("max_params") or TRY_MAX_PARAMS):
                return (f"The model has {count / 1e9:.1f}B parameters: too large to sample here, so only the answer "
                        "column was scored.")
        pair, _ = self.models({"reference": {"model": model_name, "init": {}}, "trained": None})
        tokenizer = pair["tokenizer"]
        texts = []
        for row in rows:
            input_ids, mask = self._encode(tokenizer, row["prompt"], request.get("max_prompt_length"))
            key = (int(request.get("seed", 42)), "try-reward", prompt_id_for(row), 0)
            ids = sample_completions(pair["reference"], input_ids, mask, max_new_tokens=int(request["max_new_tokens"]),
                                     eos_token_ids=pair["eos"], pad_token_id=tokenizer.pad_token_id, num_samples=1,
                                     temperature=float(request.get("temperature") or 1.0),
                                     top_p=float(request.get("top_p") or 1.0), top_k=request.get("top_k"),
                                     row_keys=[key])
            texts += decode_completions(tokenizer, ids, pair["eos"])[0]
        return texts

    @staticmethod
    def _unscored_reason(request: dict[str, Any], row: dict[str, Any] | None) -> str | None:
        """Why the run's reward cannot score this prompt (its row of the run's data, else a typed prompt), or None
        when it can: the reply and the page say it, since a null reward alone does not."""
        rewards = request.get("rewards") or []
        names = [r.get("name") for r in rewards]
        if not names:
            return "Nothing was scored: the run has no reward function."
        if row is None and "task_checker" in names:
            return ("Nothing was scored: a typed prompt is never scored on a reasoning-gym run (its task_checker "
                    "needs the task's entry). Pick one of the run's prompts to score it.")
        if row is None and not request.get("answer"):
            return ("Nothing was scored: a typed prompt is scored only against an expected answer. Give one, or pick "
                    "one of the run's prompts.")
        # What `weighted_rewards` passes, as the trainers do (`a2po.rewards.call_on_rows`).
        given = {*(k for k in (row or {}) if k != "prompt"), *TRAINER_ARGUMENTS}
        if request.get("answer"):
            given.add("ground_truth")
        for name in names:
            missing = reward_missing_columns(name, given)
            if missing:
                where = "this prompt's row of the run's data" if row is not None else \
                    "a typed prompt (its expected answer is passed as `ground_truth`)"
                listed = ", ".join(f"'{m}'" for m in missing)
                return (f"Nothing was scored: reward '{name}' needs the column{'s' if len(missing) > 1 else ''} "
                        f"{listed}, which {where} does not have. Pick one of the run's prompts, whose rows have "
                        "every column of its data.")
        return None

    @staticmethod
    def _scorable(request: dict[str, Any], row: dict[str, Any] | None) -> bool:
        return PlaygroundModels._unscored_reason(request, row) is None

    def _rewards(self, request, prompt, row, texts: list[str]) -> list[float | None]:
        """The run's weighted reward of each completion, or None each when the prompt cannot be scored."""
        if not self._scorable(request, row):
            return [None] * len(texts)
        scored = {**(row or {}), "prompt": prompt}
        if request.get("answer"):
            scored["ground_truth"] = request["answer"]  # an expected answer given with the request wins
        try:
            return weighted_rewards(request["rewards"], [scored] * len(texts), texts)
        except Exception as error:  # noqa: BLE001 - show the completions anyway, unscored
            print(f"playground: a reward failed: {error}", file=sys.stderr, flush=True)
            self._reward_failure = f"Nothing was scored: {short_text(str(error), 300)}"
            return [None] * len(texts)


def answer_completion(row: dict[str, Any], wrong: bool = False) -> str | None:
    """A completion holding a row's answer (its answer column: "should score 1"), or a deliberately wrong one
    ("should score 0": the answer's number plus one, else text that is no answer), in the form the row's answer
    takes (`#### x`, `\\boxed{x}`, a reasoning-gym `<answer>` tag). None without an answer."""
    truth = row.get("ground_truth")
    if truth is None or str(truth).strip() == "":
        return None
    truth = str(truth)
    tags = row.get("task_entry") is not None and row.get("answer_format") != "number"
    if not wrong:
        return f"<answer>{truth}</answer>" if tags else truth
    final = (extract_final_answer(truth) if ("####" in truth or "\\boxed" in truth) else truth.strip()) or truth
    try:
        number = Decimal(final.replace(",", ""))
        other = str(number + 1)
    except InvalidOperation:
        other = "I do not know."
    if tags:
        return f"<answer>{other}</answer>"
    if "\\boxed" in truth:
        return f"The answer is \\boxed{{{other}}}."
    return f"#### {other}" if "####" in truth else other


def reward_missing_columns(name: str, given: set[str]) -> list[str]:
    """The arguments reward `name` requires (no default) that are not among `given`: the dataset columns it would
    miss. [] when its signature cannot be read (or its name is unknown); calling it then says what is wrong."""
    try:
        parameters = inspect.signature(get_reward_function(name)).parameters.values()
    except Exception:  # noqa: BLE001 - a builtin without a signature, an unknown name: the call reports it
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in named and p.default is p.empty and p.name not in given]


def weighted_rewards(rewards: list[dict[str, Any]], rows: list[dict[str, Any]], texts: list[str]) -> list[float | None]:
    """The weighted reward of each completion `texts[i]` of `rows[i]`, called as the trainers call reward functions
    (`a2po.rewards.call_on_rows`: prompts, completions, every other column, and `trainer_state` as stage 1 gives it,
    the state before training; conversational prompts get conversational completions) and summed as they sum them
    (`RewardCalls.weighted`): a function's None (it does not apply to that completion) is skipped; None where every
    function skipped it. A failure or a bad result raises, naming the function (and, registered, its file)."""
    names = [reward["name"] for reward in rewards]
    calls = call_on_rows([get_reward_function(name) for name in names], names, rows, texts, None, TrainerState())
    total = calls.weighted([float(reward.get("weight", 1.0)) for reward in rewards])
    return [None if t is None else round(t, 6) for t in total]


def score_rows(rewards: list[dict[str, Any]], rows: list[dict[str, Any]], texts: list[str]) -> list[float]:
    """`weighted_rewards`, for "Try the reward": a completion that every function skipped (returned None for) raises,
    naming the functions and its task, since a run could not score it either (A*-PO stops there, GRPO gives NaN)."""
    total = weighted_rewards(rewards, rows, texts)
    skipped = [i for i, t in enumerate(total) if t is None]
    if skipped:
        names = ", ".join(r["name"] for r in rewards)
        tasks = tasks_of({"task": [row.get("task") for row in rows]}, skipped)
        raise ValueError(f"All reward functions ({names}) returned None for {len(skipped)} of {len(rows)} "
                         f"completions{tasks}: no reward scores them. Give each task a reward function that scores "
                         "it, or return 0.0 where no check applies.")
    return total


def decode_greedy_and_samples(model, input_ids, attention_mask, *, max_new_tokens: int, eos_token_ids,
                              pad_token_id: int, row_keys, temperature: float = 1.0, top_p: float = 1.0,
                              top_k: int | None = None):
    """The greedy completion of one prompt and `len(row_keys)` samples, decoded together: row 0 takes the most
    likely token, row 1 + j samples from the random stream of `row_keys[j]` (`a2po.rollout`). On a CPU a decode step
    costs about the same for one row as for nine (it reads every weight once), so this is one decode where
    `sample_completions(do_sample=False)` then `sample_completions(row_keys=...)` would be two; the tokens are the
    same as theirs (tested). Returns (1 + len(row_keys), T) ids, pad after each row's first EOS."""
    keys = [("greedy", None), *row_keys]  # the greedy row's stream is drawn but never read
    return sample_completions(model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                              eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, num_samples=len(keys),
                              temperature=temperature, top_k=top_k, top_p=top_p, row_keys=keys, greedy_samples=1)


def short_text(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def limit_threads(threads: int) -> None:
    """On a CPU, `threads` torch threads: the playground's small share beside a training run."""
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, threads))
        torch.set_num_interop_threads(max(1, threads))


def serve(idle_timeout: float, read_fd: int, write_fd: int) -> int:
    """Answer JSON-line requests from `read_fd` on `write_fd`, one at a time, until EOF or `idle_timeout` seconds
    without one. Returns the exit code."""
    playground = PlaygroundModels()
    buffer = b""
    while True:
        while b"\n" not in buffer:
            ready, _, _ = select.select([read_fd], [], [], idle_timeout)
            if not ready:
                print(f"playground: idle for {idle_timeout:.0f} s, exiting.", file=sys.stderr, flush=True)
                return 0
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                return 0  # the studio closed the pipe (or exited)
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        try:
            request = json.loads(line)
        except json.JSONDecodeError as error:
            reply: dict[str, Any] = {"id": None, "ok": False, "error": f"Bad request: {error}"}
        else:
            reply = {"id": request.get("id")}
            try:
                if request.get("op") == "ping":
                    reply.update(ok=True, result={"pid": os.getpid()})
                elif request.get("op") == "try_reward":
                    reply.update(ok=True, result=playground.try_reward(request))
                else:
                    reply.update(ok=True, result=playground.answer(request))
            except Exception as error:  # noqa: BLE001 - one bad request must not end the process
                traceback.print_exc()
                reply.update(ok=False, error=f"The playground could not answer: {type(error).__name__}: {error}")
        data = (json.dumps(reply) + "\n").encode()
        while data:
            data = data[os.write(write_fd, data):]
