"""A stand-in for the `spaces` package on a ZeroGPU Space, for tests (put this folder first on PYTHONPATH).

`GPU(duration=...)` records what it wraps and returns a function that, like ZeroGPU, computes the call's duration
(a number or a callable of the call's arguments), runs the call in a freshly forked process with its arguments
and result pickled, ends it (killed, an error raised to the caller) when it runs past that duration, and records
the call. Records go to the list `calls` and, when `FAKE_SPACES_LOG` names a file,
as JSON lines there (`{"event": "wrap" | "call", "name", "duration"}`). No GPU, no quota: nothing else of ZeroGPU.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from functools import wraps

calls: list[dict] = []
FAKE = True


def _record(entry: dict) -> None:
    calls.append(entry)
    path = os.environ.get("FAKE_SPACES_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def GPU(task=None, *, duration=None, size=None, **kwargs):  # noqa: N802 - the real package's name
    if task is None or not callable(task):
        return lambda function: GPU(function, duration=duration if task is None else task, size=size)
    _record({"event": "wrap", "name": f"{task.__module__}.{task.__qualname__}",
             "duration": "callable" if callable(duration) else duration})

    @wraps(task)
    def on_gpu(*args, **kw):
        seconds = duration(*args, **kw) if callable(duration) else (duration or 60)
        _record({"event": "call", "name": task.__qualname__, "duration": seconds, "args": [repr(a) for a in args]})
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            future = pool.submit(task, *args, **kw)
            try:
                return future.result(timeout=seconds)
            except TimeoutError:
                for process in list(pool._processes.values()):
                    process.kill()
                raise RuntimeError(f"GPU task aborted: it ran past its duration of {seconds} s") from None

    on_gpu.zerogpu = None
    return on_gpu
