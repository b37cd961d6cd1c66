"""Small helpers shared by the tests that wait on real processes."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator


def wait_for(condition: Callable[[], object], timeout: float = 120.0, what: str = "condition", poll: float = 0.25):
    """Poll `condition` until it returns something truthy (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(poll)
    raise AssertionError(f"Timed out after {timeout:.0f} s waiting for {what}.")


def wait_status(store, run_id: int, statuses: tuple[str, ...], timeout: float = 120.0, poll: float = 0.05) -> dict:
    """The run once its status is one of `statuses`; on a timeout, fail with its status, error and last log lines."""
    def check():
        run = store.get_run(run_id)
        return run if run["status"] in statuses else None
    try:
        return wait_for(check, timeout, f"run {run_id} to become {statuses}", poll)
    except AssertionError:
        run = store.get_run(run_id)
        raise AssertionError(f"run {run_id} is {run['status']} (error: {run['error']}); logs: "
                             f"{[r['message'] for r in store.get_logs(run_id)][-12:]}") from None


def put_in(store, run_id: int, status: str, **fields) -> dict:
    """Take a queued run to `status` through the state machine's events (`storage.lifecycle.path`), then set
    `fields` (a pid, a heartbeat, ...); returns the run."""
    from storage import lifecycle

    for event in lifecycle.path(status):
        assert store.apply(run_id, event), f"run {run_id}: {event} refused"
    if fields:
        store.update_run(run_id, **fields)
    return store.get_run(run_id)


@contextlib.contextmanager
def busy_cpus(count: int = 2) -> Iterator[None]:
    """`count` processes spinning beside the block, as CI's machine may be busy."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
