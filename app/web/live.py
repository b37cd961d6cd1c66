"""What every Run page of this process shares: recent snapshots of runs, and the data their views show, computed
once per data version.

Thirty students watching one run make thirty polls per interval. A poll only compares versions: the run row and
its tables' largest ids come from a snapshot read at most once per `SNAPSHOT_SECONDS` (`snapshot`), and the work
behind a new version (the V* aggregates after a stage-1 batch, the training figure after a step) is done by the
first session that needs it and reused by the others (`SHARED.get`). Entries are few and bounded (the least
recently used go first), so memory stays flat however long pages poll.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from storage import Store

SNAPSHOT_SECONDS = 1.0
MAX_ENTRIES = 256


class Shared:
    """A small process-wide cache: `get(key, version, compute)` returns the value stored for `key` if it was
    computed for `version`, else `compute(previous)` (the value of an older version, or None, so an update can
    be incremental). Concurrent callers of one key wait for a single computation instead of repeating it."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[Hashable, Any]] = OrderedDict()
        self._computing: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, version: Hashable, compute: Callable[[Any], Any]) -> Any:
        with self._lock:
            hit = self._lookup(key, version)
            if hit is not None:
                return hit[0]
            key_lock = self._computing.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                hit = self._lookup(key, version)  # computed by another session while this one waited
                previous = self._entries.get(key, (None, None))[1]
            if hit is not None:
                return hit[0]
            value = compute(previous)
            with self._lock:
                self._entries[key] = (version, value)
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    old, _ = self._entries.popitem(last=False)
                    self._computing.pop(old, None)
        return value

    def _lookup(self, key: Hashable, version: Hashable) -> tuple[Any] | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != version:
            return None
        self._entries.move_to_end(key)
        return (entry[1],)

    def forget(self, match: Callable[[Hashable], bool]) -> None:
        """Drop the entries whose key `match`es (e.g. a run's snapshot after a user changed the run)."""
        with self._lock:
            for key in [k for k in self._entries if match(k)]:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


SHARED = Shared()


def snapshot(store: Store, run_id: int) -> dict[str, Any] | None:
    """The run row, its tables' largest ids and its value set, as read at most `SNAPSHOT_SECONDS` ago (None: no
    such run). The run row is read first: when it says finished, the ids read after it include every last row."""

    def read(_previous: Any) -> dict[str, Any] | None:
        run = store.get_run(run_id)
        if run is None:
            return None
        value_set = store.get_value_set(run["value_set_id"]) if run.get("value_set_id") else None
        return {"run": run, "ids": store.last_ids(run_id), "value_set": value_set}

    return SHARED.get(("snapshot", run_id), int(time.monotonic() / SNAPSHOT_SECONDS), read)


def forget_run(run_id: int) -> None:
    """Read the run afresh at the next poll (after a stop, resume or delete from this process)."""
    SHARED.forget(lambda key: isinstance(key, tuple) and key[:2] == ("snapshot", run_id))


# Gradio's own values on Windows (it uses 1 and 10 ms elsewhere).
QUEUE_IDLE_SLEEP = 0.05
PROGRESS_IDLE_SLEEP = 0.1
ANALYTICS_EVERY = 1000
ANALYTICS_KEPT = 1000


def calm_queue(demo: Any) -> None:
    """Make the Gradio queue of `demo` cheap while idle and per event (call after `demo.queue()`, which builds it;
    attributes a Gradio version lacks are left alone):

    - look for new events 20 times a second while idle instead of 1000 (progress updates 10 instead of 100), as
      Gradio does on Windows: its 1 ms loop kept the server's event loop busy with no page open, a slower loop
      costs a fraction of that (figures: docs/benchmarks.md, "Design figures"). A new event starts at most 50 ms later.
    - summarise its event analytics (a pandas DataFrame of up to the last 10,000 events, grouped per function)
      every 1,000 events instead of after every one, and keep 1,000 events: with pages polling, the server's CPU per
      event grew with the events seen, on up to 10,000; now it stays flat (docs/benchmarks.md, "Design figures").
      The studio turns Gradio's monitoring off, so nothing reads that summary.
    """
    queue = getattr(demo, "_queue", None)
    if queue is None:
        return
    for name, value in (("sleep_when_free", QUEUE_IDLE_SLEEP), ("progress_update_sleep_when_free", PROGRESS_IDLE_SLEEP),
                        ("ANAYLTICS_CACHE_FREQUENCY", ANALYTICS_EVERY), ("ANALYTICS_MAX_EVENTS", ANALYTICS_KEPT)):
        if isinstance(getattr(queue, name, None), (int, float)):
            setattr(queue, name, max(getattr(queue, name), value) if "sleep" in name else value)
