"""Page-driven chunks (ZeroGPU): the Run page of the visitor who launched a chunked run calls its chunks on that
visitor's GPU quota (`app.runtime.zerogpu.ChunkDriver`); the scheduler starts none, and never signals a process of
ZeroGPU's (docs/runtime.md, "Page-driven chunks")."""

from __future__ import annotations

import os
from typing import Any

from app.runtime import journal
from app.runtime.chunks import is_chunked
from app.runtime.data_folder import DataFolder
from app.runtime.launchers.forked import ForkedChunks
from storage import Store, lifecycle

PAUSE_AFTER = 20.0  # seconds a queued run waits for a page to drive it before it is paused


class PageChunks(ForkedChunks):
    """Chunks run by pages of this process; `pause_after`: seconds without a page driving a queued run before it
    becomes "paused"."""

    starts_runs = False
    paused = True

    def __init__(self, store: Store, folder: DataFolder, budget: float | None = None,
                 pause_after: float = PAUSE_AFTER) -> None:
        super().__init__(store, folder, budget)
        self.pause_after = pause_after

    def start(self, run: dict[str, Any], devices: list[str], env: dict[str, str]) -> bool:
        return False  # its page runs its chunks

    def driven_here(self, run: dict[str, Any]) -> bool:
        """A chunk driven by a page of this process (it claimed the run with this process's pid)."""
        return run.get("pid") == os.getpid() and run["id"] not in self.procs

    def alive(self, run: dict[str, Any]) -> bool:
        return self.driven_here(run) or super().alive(run)

    def kill(self, run: dict[str, Any], timeout: float = 10.0) -> None:
        """A chunk of ZeroGPU's is never signalled: it is asked to stop (its GPU call's duration bounds it)."""
        journal.request_stop(self.folder.root, run["id"])
        super().kill(run, timeout)

    def followed_elsewhere(self, run: dict[str, Any]) -> str | None:
        return "its page" if self.driven_here(run) else None

    def each_pass(self) -> str | None:
        """Queued chunked runs that no page drove for `pause_after` seconds become "paused"."""
        now = self.now()
        for run in self.store.list_runs(status=lifecycle.QUEUED):
            last = max(run["queued_at"] or 0.0, run["heartbeat_at"] or 0.0)
            if is_chunked(run) and now - last > self.pause_after and self.store.apply(run["id"], lifecycle.PAUSE):
                self.store.add_log(run["id"], "Paused: no open page of the run drives its chunks. Open the run's "
                                              "page to go on.")
        return None
