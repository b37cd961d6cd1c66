"""Small helpers shared by the tests that wait on real processes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], timeout: float = 120.0, what: str = "condition", poll: float = 0.25):
    """Poll `condition` until it returns something truthy (returned), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(poll)
    raise AssertionError(f"Timed out after {timeout:.0f} s waiting for {what}.")
