"""The playground's model process: reference and trained policies answer one prompt side by side, scored by the
run's reward (the page `app.web.pages.playground` and the `/playground` endpoint use it). No Gradio here.

`PlaygroundClient` starts `python -m app.runtime.playground` on first use, without credentials, and talks to it in
JSON lines over stdin and stdout, one request at a time. Its process, cache, share of the machine, limits and
scoring: docs/api.md, "The playground".
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from a2po.answers import CORRECT_THRESHOLD
from app.runtime.processes import with_project_path

IDLE_TIMEOUT = 600.0  # seconds without a request after which the process exits (its models leave memory)
REQUEST_TIMEOUT = 300.0  # seconds one request may take, model loading included
MAX_SAMPLES = 8
MAX_PROMPT_CHARS = 2_000
MAX_ANSWER_CHARS = 500
DEFAULT_MAX_NEW_TOKENS = 256  # a bare model (no run): A2POConfig's default max_completion_length
NICE = 10
THREADS = 1
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin")


class PlaygroundError(RuntimeError):
    """A request the playground could not answer (the message says why and what to do)."""


# ---------------------------------------------------------------------------------------------------- app side

def trained_weights(store: Any, run: dict[str, Any], data_dir: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """The folder with a run's trained weights and how to call it: the final model ("final model") when the run
    saved one, else its newest complete checkpoint ("checkpoint step N"); None when it has none yet."""
    from a2po.checkpoints import checkpoint_complete
    from app.runtime.data_folder import DataFolder

    out = Path(run["output_dir"]) if run.get("output_dir") else DataFolder(data_dir).run_output(run["id"])
    has_config = (out / "config.json").is_file() or (out / "adapter_config.json").is_file()
    if has_config and any((out / name).is_file() for name in WEIGHT_FILES):
        return out, "final model"
    folders = {p for p in out.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()}
    folders |= {Path(row["path"]) for row in store.list_checkpoints(run["id"])}
    for folder in sorted(folders, key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit()
                         else -1, reverse=True):
        if checkpoint_complete(folder):
            step = json.loads((folder / "trainer_state.json").read_text())["global_step"]
            return folder, f"checkpoint step {step}"
    return None


def check_request(prompt: Any, num_samples: Any, answer: Any) -> tuple[str, int, str | None]:
    """The clean (prompt, num_samples, answer), or ValueError naming the problem."""
    prompt = prompt if isinstance(prompt, str) else ""
    if not prompt.strip():
        raise ValueError("Write a prompt, or pick one of the run's prompts.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"The prompt has {len(prompt)} characters; the playground takes at most "
                         f"{MAX_PROMPT_CHARS}.")
    try:
        number = int(num_samples)
    except (TypeError, ValueError):
        raise ValueError(f"num_samples must be a whole number from 1 to {MAX_SAMPLES}.") from None
    if isinstance(num_samples, bool) or number != num_samples or not 1 <= number <= MAX_SAMPLES:
        raise ValueError(f"num_samples must be a whole number from 1 to {MAX_SAMPLES} (got {num_samples!r}).")
    answer = answer.strip() if isinstance(answer, str) else ""
    if len(answer) > MAX_ANSWER_CHARS:
        raise ValueError(f"The expected answer has {len(answer)} characters; at most {MAX_ANSWER_CHARS}.")
    return prompt.strip(), number, answer or None


def build_request(*, prompt: str, num_samples: int, answer: str | None, limits: Any, run: dict[str, Any] | None = None,
                  model: str | None = None, weights: tuple[Path, str] | None = None) -> dict[str, Any]:
    """What the process needs to answer: models, data, rewards and sampling settings, bounded by `limits`
    (`app.access.policy.Limits`). With a run: its spec; without: the bare `model`."""
    from a2po.config import A2POConfig

    defaults = {f: A2POConfig.__dataclass_fields__[f].default for f in ("temperature", "top_p", "top_k",
                                                                         "max_prompt_length")}
    if run is not None:
        spec = run.get("config") or {}
        config = spec.get("config") or {}
        init = dict(config.get("model_init_kwargs") or {})
        if config.get("trust_remote_code"):
            init.setdefault("trust_remote_code", True)
        max_new = config.get("max_completion_length") or DEFAULT_MAX_NEW_TOKENS
        request = {"reference": {"model": spec["model"], "init": init}, "dataset": spec.get("dataset"),
                   "rewards": spec.get("rewards") or [], "seed": int(config.get("seed", 42)),
                   **{k: config.get(k, v) for k, v in defaults.items()}}
    else:
        max_new = DEFAULT_MAX_NEW_TOKENS
        request = {"reference": {"model": model, "init": {}}, "dataset": None,
                   "rewards": [{"name": "exact_match", "weight": 1.0}], "seed": 42, **defaults}
    request["max_new_tokens"] = max(1, min(int(max_new), int(limits.max_completion_length)))
    if request["max_prompt_length"] is not None:
        request["max_prompt_length"] = min(int(request["max_prompt_length"]), int(limits.max_prompt_length))
    else:
        request["max_prompt_length"] = int(limits.max_prompt_length)
    if weights is not None:
        folder = weights[0]
        request["trained"] = {"path": str(folder), "adapter": (folder / "adapter_config.json").is_file(),
                              "label": weights[1]}
    else:
        request["trained"] = None
    request.update(prompt=prompt, num_samples=num_samples, answer=answer)
    return request


TRY_ROWS = 8  # prompts "Try the reward" scores
TRY_MAX_NEW_TOKENS = 256  # at most, for the model's samples of "Try the reward"
TRY_MAX_PARAMS = 1.0e9  # a larger model is not sampled by "Try the reward" (the answer column still is)
KINDS = {"answer": "answer column", "wrong": "wrong answer", "sample": "model sample"}


def build_try_request(*, dataset: dict[str, Any], rewards: list[dict[str, Any]], model: str | None,
                      config: dict[str, Any], limits: Any, rows: int = TRY_ROWS) -> dict[str, Any]:
    """What the process needs for "Try the reward": a checked dataset and rewards, the model to sample (None: the
    answer column only) and the run's sampling settings, bounded by `limits`."""
    from a2po.config import A2POConfig

    defaults = A2POConfig.__dataclass_fields__

    def setting(name: str) -> Any:
        return config.get(name, defaults[name].default)

    max_new = min(int(setting("max_completion_length") or TRY_MAX_NEW_TOKENS), TRY_MAX_NEW_TOKENS,
                  int(limits.max_completion_length))
    prompt_limit = setting("max_prompt_length")
    return {"op": "try_reward", "dataset": dataset, "rewards": rewards, "rows": int(rows),
            "model": model, "max_params": TRY_MAX_PARAMS, "max_new_tokens": max(1, max_new),
            "max_prompt_length": min(int(prompt_limit or limits.max_prompt_length), int(limits.max_prompt_length)),
            "temperature": setting("temperature"), "top_p": setting("top_p"), "top_k": setting("top_k"),
            "seed": int(setting("seed"))}


def reward_verdict(result: dict[str, Any]) -> str:
    """One line on what "Try the reward" found: whether the reward tells the answer column (it should score 1)
    from a wrong answer (0), what the model's samples score, and rewards that failed or are not binary."""
    if result.get("error"):
        return f"❌ The reward failed: {result['error']}"
    rows = result.get("rows") or []
    scores = {kind: [r["reward"] for r in rows if r["kind"] == label] for kind, label in KINDS.items()}
    answers, wrongs, samples = scores["answer"], scores["wrong"], scores["sample"]
    if not answers:
        return "⚠ The dataset has no answer column (ground_truth): only the model's samples could be scored."
    n = len(answers)
    right = sum(r >= CORRECT_THRESHOLD for r in answers)
    fooled = sum(r >= CORRECT_THRESHOLD for r in wrongs)
    if right == 0:
        line = (f"⚠ This reward gives 0 to the dataset's own answers ({n} of {n} prompts): training would see 0 "
                "everywhere and learn nothing. Check the answer column, and the format the function expects.")
    elif fooled == len(wrongs):
        line = (f"⚠ This reward gives 1 to wrong answers too ({fooled} of {len(wrongs)} prompts): it cannot tell "
                "right from wrong.")
    elif right == n and fooled == 0:
        line = (f"✅ The reward tells right from wrong: the answer column scores 1 on {right} of {n} prompts, a wrong "
                f"answer 0 on {len(wrongs)} of {len(wrongs)}.")
    else:
        line = (f"⚠ Mixed: the answer column scores 1 on {right} of {n} prompts, a wrong answer 1 on {fooled} of "
                f"{len(wrongs)}.")
    if samples:
        line += f" The model's samples score 1 on {sum(r >= CORRECT_THRESHOLD for r in samples)} of {len(samples)}."
    odd = next((r for r in answers + wrongs + samples if r not in (0.0, 1.0)), None)
    if odd is not None:
        line += f" Some rewards are outside {{0, 1}} (e.g. {odd:g}): A*-PO counts only 1 as correct."
    if result.get("note"):
        line += f" {result['note']}"
    return line


def answer_completion(row: dict[str, Any], wrong: bool = False) -> str | None:
    """A completion holding a row's answer (its answer column: "should score 1"), or a deliberately wrong one
    ("should score 0": the answer's number plus one, else text that is no answer), in the form the row's answer
    takes (`#### x`, `\\boxed{x}`, a reasoning-gym `<answer>` tag). None without an answer."""
    from decimal import Decimal, InvalidOperation

    from a2po.answers import extract_final_answer

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


def choose_gpu(gpus: tuple[str, ...] | list[str], busy: set[str]) -> str | None:
    """The GPU the playground process uses: the first one no run uses, else the first (shared); None on a CPU
    machine."""
    if not gpus:
        return None
    return next((g for g in gpus if g not in busy), gpus[0])


class PlaygroundClient:
    """The UI side of the playground: starts the process on first use, sends one request at a time, restarts a
    process that died, kills one that runs past `request_timeout`.

    Args:
        data_dir: the studio's data folder (the process logs to `logs/playground.log`, runs in `cache/worker-cwd`).
        env: the process's environment (default: this one); `OMP_NUM_THREADS` and the like are set to `threads`.
        idle_timeout: seconds without a request after which the process exits.
        request_timeout: seconds one request may take.
        nice: priority increment of the process (0: none).
        threads: torch threads of the process on a CPU.
        gpu: the GPU it may use (`CUDA_VISIBLE_DEVICES`), "" for none, None to leave the environment as it is;
            or a callable returning one, called at each start.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, env: dict[str, str] | None = None,
                 idle_timeout: float = IDLE_TIMEOUT, request_timeout: float = REQUEST_TIMEOUT, nice: int = NICE,
                 threads: int = THREADS, gpu: Any = None) -> None:
        self.data_dir = Path(data_dir)
        self.env = env
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.nice = nice
        self.threads = threads
        self.gpu = gpu
        self.starts = 0  # processes started so far (the tests count restarts)
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        """The live process's pid, or None."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        from app.runtime.data_folder import DataFolder

        return DataFolder(self.data_dir).logs / "playground.log"

    def _environment(self) -> dict[str, str]:
        env = with_project_path(self.env if self.env is not None else os.environ)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(self.threads)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        gpu = self.gpu() if callable(self.gpu) else self.gpu
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        return env

    def _start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        from app.runtime.data_folder import DataFolder

        cwd = DataFolder(self.data_dir).make_worker_cwd()
        command = [sys.executable, "-m", "app.runtime.playground", "--idle-timeout", str(self.idle_timeout),
                   "--nice", str(self.nice), "--threads", str(self.threads)]
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          env=self._environment(), cwd=cwd, start_new_session=True, close_fds=True)
        self._buffer = b""
        self.starts += 1

    def warm(self) -> bool:
        """Start the process now, if it is not running and no request holds it, without waiting for it: its
        imports (seconds) then overlap with the user picking a run and a prompt. Returns True if it started one."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._proc is not None and self._proc.poll() is None:
                return False
            self.close()
            self._start()
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the process (its models leave memory); the next request starts a new one."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.stdin.close()  # EOF: it exits by itself
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._kill(proc)
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request (waiting for the one before it); returns the process's answer or raises
        `PlaygroundError`. A process that is gone (idle exit, a kill) is started again, and the request retried
        once when it died before answering."""
        with self._lock:
            for attempt in (1, 2):
                fresh = self._proc is None or self._proc.poll() is not None
                if fresh:
                    self.close()
                    self._start()
                try:
                    return self._exchange(request)
                except _ProcessGone as gone:
                    self.close()
                    if attempt == 2 or fresh:
                        raise PlaygroundError(f"The playground process died while answering ({gone}); its log is "
                                              f"{self.log_path}:\n{_tail(self.log_path)}") from None
        raise AssertionError("unreachable")

    def _exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        message = {**request, "id": self._next_id}
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise _ProcessGone(f"could not send the request: {error}") from None
        deadline = time.monotonic() + self.request_timeout
        while True:
            line = self._read_line(deadline)
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue  # not a protocol line
            if reply.get("id") != self._next_id:
                continue
            if not reply.get("ok"):
                raise PlaygroundError(reply.get("error") or "The playground failed (no message).")
            return reply["result"]

    def _read_line(self, deadline: float) -> str:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill(self._proc)
                self.close()
                raise PlaygroundError(f"The playground did not answer within {self.request_timeout:.0f} s, so it was "
                                      "stopped (it starts again with the next request). Ask for fewer samples or a "
                                      "shorter prompt; a machine busy training answers more slowly.")
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                if self._proc.poll() is not None:
                    raise _ProcessGone(f"exit code {self._proc.returncode}")
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._proc.wait()
                raise _ProcessGone(f"exit code {self._proc.returncode}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace")


class _ProcessGone(Exception):
    pass


def short_text(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------------- process side

class PlaygroundModels:
    """Loads models (caching the last pair and the last run's data), decodes and scores. Lives in the playground
    process."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
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
        import gc

        gc.collect()
        self._pair = self._load(reference, trained)
        self._pair_key = key
        return self._pair, False

    def _load(self, reference: dict[str, Any], trained: dict[str, Any] | None) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from a2po.models import resolve_model

        base_path = resolve_model(reference["model"])
        init = dict(reference.get("init") or {})
        tokenizer = AutoTokenizer.from_pretrained(base_path, revision=init.get("revision"),
                                                  trust_remote_code=bool(init.get("trust_remote_code")))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        base = AutoModelForCausalLM.from_pretrained(base_path, **init).to(self.device).eval()
        pair: dict[str, Any] = {"tokenizer": tokenizer, "reference": base, "trained": None, "adapter": False}
        if trained is not None:
            if not Path(trained["path"]).is_dir():
                raise FileNotFoundError(f"The trained weights {trained['path']} are gone (a newer checkpoint "
                                        "replaced them?): ask again.")
            if trained.get("adapter"):
                from peft import PeftModel

                pair["trained"] = PeftModel.from_pretrained(base, trained["path"]).to(self.device).eval()
                pair["adapter"] = True
            else:
                init_trained = {k: v for k, v in init.items() if k != "revision"}
                pair["trained"] = AutoModelForCausalLM.from_pretrained(trained["path"], **init_trained)
                pair["trained"].to(self.device).eval()
        for model in (pair["reference"], pair["trained"]):
            if model is not None:
                model.requires_grad_(False)
        gen = getattr(base, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) or tokenizer.eos_token_id
        pair["eos"] = sorted({*([eos] if isinstance(eos, int) else eos), tokenizer.eos_token_id} - {None})
        return pair

    def rows(self, dataset: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        """The run's data rows by question (train and eval), built once per dataset spec; {} when it cannot be
        built here (a hub dataset while offline): its prompts are then scored like typed ones."""
        if not dataset:
            return {}
        key = json.dumps(dataset, sort_keys=True, default=str)
        if key == self._data_key:
            return self._rows
        from a2po.answers import prompt_question
        from a2po.runspec import RunSpec

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
                   device=str(self.device), threads=self.torch.get_num_threads(), data_error=self._data_error)
        return out

    def _encode(self, tokenizer, prompt: Any, limit: int | None):
        torch = self.torch
        if isinstance(prompt, str):
            text = prompt
        else:
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
        if limit:
            ids = ids[-int(limit):]
        if not ids:
            raise ValueError("The prompt encodes to no tokens.")
        input_ids = torch.tensor([ids], device=self.device)
        return input_ids, torch.ones_like(input_ids)

    def _complete(self, model, pair, encoded, request, prompt, row) -> list[dict[str, Any]]:
        from a2po.core import completion_mask

        input_ids, mask = encoded
        tokenizer = pair["tokenizer"]
        n = int(request["num_samples"])
        keys = [(request.get("seed", 42), "playground", request["prompt"].strip(), j) for j in range(n)]
        ids = decode_greedy_and_samples(model, input_ids, mask, max_new_tokens=int(request["max_new_tokens"]),
                                        eos_token_ids=pair["eos"], pad_token_id=tokenizer.pad_token_id, row_keys=keys,
                                        temperature=float(request.get("temperature") or 1.0),
                                        top_p=float(request.get("top_p") or 1.0), top_k=request.get("top_k"))
        keep = completion_mask(ids, pair["eos"])
        texts = tokenizer.batch_decode(ids * keep + tokenizer.pad_token_id * (1 - keep), skip_special_tokens=True)
        rewards = self._rewards(request, prompt, row, texts)
        return [{"completion": text, "reward": reward, "greedy": i == 0}
                for i, (text, reward) in enumerate(zip(texts, rewards))]

    # -- trying a reward ----------------------------------------------------------------------------------------

    def try_reward(self, request: dict[str, Any]) -> dict[str, Any]:
        """Score a few of the dataset's first prompts with the request's rewards: each row's answer column (which
        should score 1), a wrong answer (0) and, when the model is small enough, one sample of it. Returns
        {"rows": [{"prompt", "kind", "completion", "reward"}], "error", "note", "model_pid"}; a reward that fails
        is the `error`, not an exception."""
        from a2po.answers import prompt_question
        from a2po.runspec import RunSpec

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
        from transformers import AutoConfig, AutoModelForCausalLM

        from a2po.core import completion_mask
        from a2po.models import is_default_model, resolve_model
        from a2po.rollout import sample_completions
        from a2po.values import prompt_id_for

        model_name = request["model"]
        if not is_default_model(model_name):
            config = AutoConfig.from_pretrained(resolve_model(model_name))
            with self.torch.device("meta"):
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
            keep = completion_mask(ids, pair["eos"])
            texts += tokenizer.batch_decode(ids * keep + tokenizer.pad_token_id * (1 - keep), skip_special_tokens=True)
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
        # The columns `weighted_rewards` passes, as the trainer does (`a2po.rewards.call_reward`).
        given = {*(k for k in (row or {}) if k != "prompt"), "prompts", "completions", "trainer_state"}
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


def reward_missing_columns(name: str, given: set[str]) -> list[str]:
    """The arguments reward `name` requires (no default) that are not among `given`: the dataset columns it would
    miss. [] when its signature cannot be read (or its name is unknown); calling it then says what is wrong."""
    from a2po.reward_registry import get_reward_function

    try:
        parameters = inspect.signature(get_reward_function(name)).parameters.values()
    except Exception:  # noqa: BLE001 - a builtin without a signature, an unknown name: the call reports it
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in named and p.default is p.empty and p.name not in given]


def weighted_rewards(rewards: list[dict[str, Any]], rows: list[dict[str, Any]], texts: list[str]) -> list[float | None]:
    """The weighted reward of each completion `texts[i]` of `rows[i]`, called as the trainer calls reward functions
    (`a2po.rewards.call_reward`: prompts, completions, every other column, and `trainer_state` as stage 1 gives it,
    the state before training; conversational prompts get conversational completions). A function's None (it does
    not apply to that completion) is skipped, as in training; None where every function skipped it. A failure or a
    bad result raises, naming the function (and, registered, its file)."""
    from transformers import TrainerState

    from a2po.reward_registry import get_reward_function
    from a2po.rewards import as_given, call_reward

    prompts = [row["prompt"] for row in rows]
    completions = [as_given(p, t) for t, p in zip(texts, prompts)]
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key not in ("prompt", "completions")}
    state = TrainerState()
    total: list[float | None] = [None] * len(rows)
    for reward in rewards:
        values = call_reward(get_reward_function(reward["name"]), reward["name"], prompts, completions, columns, state)
        weight = float(reward.get("weight", 1.0))
        total = [t if v is None else (t or 0.0) + weight * v for t, v in zip(total, values)]
    return [None if t is None else round(t, 6) for t in total]


def score_rows(rewards: list[dict[str, Any]], rows: list[dict[str, Any]], texts: list[str]) -> list[float]:
    """`weighted_rewards`, for "Try the reward": a completion that every function skipped (returned None for) raises,
    naming the functions and its task, since a run could not score it either (A*-PO stops there, GRPO gives NaN)."""
    from a2po.rewards import tasks_of

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
    from a2po.rollout import sample_completions

    keys = [("greedy", None), *row_keys]  # the greedy row's stream is drawn but never read
    return sample_completions(model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                              eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, num_samples=len(keys),
                              temperature=temperature, top_k=top_k, top_p=top_p, row_keys=keys, greedy_samples=1)


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
                import traceback

                traceback.print_exc()
                reply.update(ok=False, error=f"The playground could not answer: {type(error).__name__}: {error}")
        data = (json.dumps(reply) + "\n").encode()
        while data:
            data = data[os.write(write_fd, data):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.runtime.playground", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT)
    parser.add_argument("--nice", type=int, default=NICE)
    parser.add_argument("--threads", type=int, default=THREADS)
    options = parser.parse_args(argv)
    # The protocol owns the original stdout; whatever the libraries print goes to stderr (the log).
    protocol = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if options.nice:
        os.nice(options.nice)
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, options.threads))
        torch.set_num_interop_threads(max(1, options.threads))
    # What every request needs, imported before the first one arrives (a warm start overlaps this with the user).
    import transformers  # noqa: F401

    import a2po.data  # noqa: F401
    import a2po.rewards  # noqa: F401
    import a2po.rollout  # noqa: F401
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return serve(options.idle_timeout, sys.stdin.fileno(), protocol)


if __name__ == "__main__":
    sys.exit(main())
