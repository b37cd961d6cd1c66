"""Fail points: named places in a run where a fault-injection test can kill, hang or break the process.

Durability claims ("a worker killed mid-step resumes to the same losses") are only as good as the points they
were tested at, and a test cannot SIGKILL a process at an exact line from outside. So the code marks a few such
places with `fault_point(name)`, and the environment variable `A2PO_FAULTS` arms them:

    A2PO_FAULTS="train_step@3=kill"               # SIGKILL itself the 3rd time it reaches train_step
    A2PO_FAULTS="values_batch@2=kill,checkpoint@1=hang"

Actions: `kill` (SIGKILL: no handler, no flush, no cleanup, like the OOM killer), `hang` (the calling thread
sleeps forever while the others, such as a heartbeat, go on), `delay` (the calling thread sleeps `A2PO_FAULT_DELAY`
seconds, default `DELAY_SECONDS`, then goes on: a slow moment), `raise` (a `FaultInjected` exception), `disk_full`
(the `OSError` a write on a full disk raises, ENOSPC).
`name@count+=action` acts from the count-th pass on, every time.
Unset (always, outside tests) the points cost one dictionary lookup.

Points in the library: `values_batch` (a stage-1 batch sampled and scored, not yet handed to the callbacks),
`train_step` (a stage-2 step's completions sampled, before its loss and backward pass), `checkpoint` (a
checkpoint's weights written, its optimizer, scheduler, RNG and trainer state not yet), `evaluate_batch` (an
evaluation batch decoded and scored). The studio's worker adds its own (`app.runtime.worker`: `worker_start`,
`record_end`, `worker_exit`).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections import Counter

ENV = "A2PO_FAULTS"
FAULT_ACTIONS = ("kill", "hang", "delay", "raise", "disk_full")
DELAY_ENV = "A2PO_FAULT_DELAY"  # seconds a `delay` sleeps (default `DELAY_SECONDS`)
DELAY_SECONDS = 2.0


class FaultInjected(RuntimeError):
    """Raised at an armed fail point whose action is `raise`."""


def parse(spec: str) -> dict[str, tuple[int, str, bool]]:
    """`"name@count=action,..."` -> `{name: (count, action, repeat)}` (count defaults to 1, action to kill; a `+`
    after the count repeats the action on every later pass)."""
    armed: dict[str, tuple[int, str, bool]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        target, _, action = item.partition("=")
        name, _, count = target.partition("@")
        repeat = count.endswith("+")
        count = count.rstrip("+")
        action = action or "kill"
        if action not in FAULT_ACTIONS or (count and not count.isdigit()):
            raise ValueError(f"Bad {ENV} entry {item!r}: write name@count=action with action one of {FAULT_ACTIONS}.")
        armed[name] = (int(count or 1), action, repeat)
    return armed


_armed = parse(os.environ.get(ENV, ""))
_reached: Counter[str] = Counter()


def rearm() -> None:
    """Arm the points from `A2PO_FAULTS` as it is now, with fresh counts: for a process that did not start with
    this environment, such as a chunk forked from the studio (`app.runtime.chunks`)."""
    global _armed
    _armed = parse(os.environ.get(ENV, ""))
    _reached.clear()


def fault_point(name: str) -> None:
    """Count a pass through `name`; act when the count reaches the armed one (see the module docstring)."""
    if not _armed or name not in _armed:
        return
    _reached[name] += 1
    count, action, repeat = _armed[name]
    if _reached[name] < count or (_reached[name] > count and not repeat):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        threading.Event().wait()
    if action == "delay":
        time.sleep(float(os.environ.get(DELAY_ENV) or DELAY_SECONDS))
        return
    if action == "disk_full":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"(fault injected at {name}, pass {count})")
    raise FaultInjected(f"Fault injected at {name} (pass {count}).")
