"""The playground's client, what the studio's process imports: the requests (checked and bounded by the studio's
limits), and `PlaygroundClient`, which starts the model process (`python -m app.runtime.playground`,
`app.runtime.playground.process`) on first use, without credentials, and talks to it in JSON lines over its stdin and
stdout, one request at a time. Its process, cache, share of the machine, limits and scoring: docs/api.md, "The
playground". No torch and no Gradio here.
"""

from __future__ import annotations

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

from app.runtime.data_folder import DataFolder, tail
from app.runtime.processes import with_project_path

IDLE_TIMEOUT = 600.0  # seconds without a request after which the process exits (its models leave memory)
REQUEST_TIMEOUT = 300.0  # seconds one request may take, model loading included
MAX_SAMPLES = 8
MAX_PROMPT_CHARS = 2_000
MAX_ANSWER_CHARS = 500
DEFAULT_MAX_NEW_TOKENS = 256  # a bare model (no run): A2POConfig's default max_completion_length
NICE = 10
THREADS = 1
TRY_ROWS = 8  # prompts "Try the reward" scores
TRY_MAX_NEW_TOKENS = 256  # at most, for the model's samples of "Try the reward"
TRY_MAX_PARAMS = 1.0e9  # a larger model is not sampled by "Try the reward" (the answer column still is)
# What "Try the reward" scores on each prompt, and how its reply names it.
KINDS = {"answer": "answer column", "wrong": "wrong answer", "sample": "model sample"}
SAMPLING = ("temperature", "top_p", "top_k", "max_prompt_length")


class PlaygroundError(RuntimeError):
    """A request the playground could not answer (the message says why and what to do)."""


def run_settings(config: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The settings `names` of a run's config, each else A2POConfig's default."""
    # Imported here: the config imports torch, which the studio keeps out of its start (its pages import this module).
    from a2po.config import A2POConfig

    fields = A2POConfig.__dataclass_fields__
    return {name: config.get(name, fields[name].default) for name in names}


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
    if run is not None:
        spec = run.get("config") or {}
        config = spec.get("config") or {}
        init = dict(config.get("model_init_kwargs") or {})
        if config.get("trust_remote_code"):
            init.setdefault("trust_remote_code", True)
        max_new = config.get("max_completion_length") or DEFAULT_MAX_NEW_TOKENS
        request = {"reference": {"model": spec["model"], "init": init}, "dataset": spec.get("dataset"),
                   "rewards": spec.get("rewards") or [], "seed": int(config.get("seed", 42)),
                   **run_settings(config, SAMPLING)}
    else:
        max_new = DEFAULT_MAX_NEW_TOKENS
        request = {"reference": {"model": model, "init": {}}, "dataset": None,
                   "rewards": [{"name": "exact_match", "weight": 1.0}], "seed": 42, **run_settings({}, SAMPLING)}
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


def build_try_request(*, dataset: dict[str, Any], rewards: list[dict[str, Any]], model: str | None,
                      config: dict[str, Any], limits: Any, rows: int = TRY_ROWS) -> dict[str, Any]:
    """What the process needs for "Try the reward": a checked dataset and rewards, the model to sample (None: the
    answer column only) and the run's sampling settings, bounded by `limits`."""
    setting = run_settings(config, ("max_completion_length", *SAMPLING, "seed"))
    max_new = min(int(setting["max_completion_length"] or TRY_MAX_NEW_TOKENS), TRY_MAX_NEW_TOKENS,
                  int(limits.max_completion_length))
    prompt_limit = setting["max_prompt_length"]
    return {"op": "try_reward", "dataset": dataset, "rewards": rewards, "rows": int(rows),
            "model": model, "max_params": TRY_MAX_PARAMS, "max_new_tokens": max(1, max_new),
            "max_prompt_length": min(int(prompt_limit or limits.max_prompt_length), int(limits.max_prompt_length)),
            "temperature": setting["temperature"], "top_p": setting["top_p"], "top_k": setting["top_k"],
            "seed": int(setting["seed"])}


def choose_gpu(gpus: tuple[str, ...] | list[str], busy: set[str]) -> str | None:
    """The GPU the playground process uses: the first one no run uses, else the first (shared); None on a CPU
    machine."""
    if not gpus:
        return None
    return next((g for g in gpus if g not in busy), gpus[0])


class PlaygroundClient:
    """The studio's side of the playground: starts the process on first use, sends one request at a time, restarts a
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
                                              f"{self.log_path}:\n{tail(self.log_path, 15)}") from None
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
