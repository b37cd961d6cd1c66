"""How a run's process is started, watched, stopped and read: one `Launcher` (`base.py`) per backend, which the
scheduler picks once per runner (`Backend.launcher_for`) and never asks which backend it has. Each launcher's rules,
and how its processes end, are in docs/runtime.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.runtime.data_folder import DataFolder
from app.runtime.devices import Devices
from app.runtime.launchers.base import (
    EXITED,
    FAILED,
    LOST,
    Ending,
    Launcher,
    LaunchFailed,
    processes_of,
    worker_command,
    worker_environment,
)
from app.runtime.launchers.forked import ForkedChunks
from app.runtime.launchers.local import LocalWorkers
from app.runtime.launchers.pages import PAUSE_AFTER, PageChunks
from storage import Store

__all__ = ["EXITED", "FAILED", "LOST", "Backend", "Ending", "LaunchFailed", "Launcher", "backend_for",
           "processes_of", "worker_command", "worker_environment"]


@dataclass
class Backend:
    """Where runs go: a launcher per runner, the devices they share, and what a visitor may not read."""

    name: str  # "local", "ray", "zerogpu": where the API's /limits says runs go
    launchers: dict[str, Launcher]
    refused: dict[str, str] = field(default_factory=dict)  # runner -> why this studio cannot run it
    runner: str | None = None  # every run goes this way, whatever its spec asks
    devices: Callable[[], Devices] | None = None  # reads the devices (a cluster's); None: the machine's
    describe: Callable[[], dict[str, Any]] | None = None  # where runs go, for `where()`; None: the devices
    check: Callable[[int], str | None] | None = None  # why a run of that many processes can never start here
    hidden: tuple[str, ...] = ()  # texts (addresses) no visitor may read

    def launcher_for(self, run: dict[str, Any]) -> Launcher:
        spec = run.get("config") if "action" in run else run
        runner = (spec or {}).get("runner") or "worker"
        return self.launchers.get(runner) or self.launchers["worker"]

    def each_pass(self) -> str | None:
        problems = [launcher.each_pass() for launcher in self.launchers.values()]
        return next((p for p in problems if p), None)


def backend_for(store: Store, folder: DataFolder, command: Callable[[int, dict[str, Any]], list[str]], *,
                ray: Any = None, zerogpu: bool = False, chunk_seconds: float | None = None,
                pause_after: float | None = None) -> Backend:
    """The launchers of this studio: local worker processes and forked chunks; with `ray` (a `RayCluster`) workers
    as Ray jobs and no chunks; with `zerogpu` every run chunked and driven by its page. `command(run_id, spec)` is
    the worker command."""
    if ray is not None and zerogpu:
        raise ValueError("A ZeroGPU Space runs its chunks on the visitor's GPU calls: it cannot use a Ray cluster.")
    local = LocalWorkers(store, folder, command)
    if ray is not None:
        from app.runtime.launchers.ray import RayWorkers

        workers = RayWorkers(store, folder, command, ray, local)
        return Backend("ray", {"worker": workers}, devices=ray.devices, describe=ray.describe, check=ray.check,
                       hidden=(ray.address,),
                       refused={"chunked": "Chunked runs are forked from the studio's own process, and this studio "
                                           "sends its runs to a Ray cluster: use runner 'worker'."})
    if zerogpu:
        pages = PageChunks(store, folder, chunk_seconds, PAUSE_AFTER if pause_after is None else pause_after)
        return Backend("zerogpu", {"worker": local, "chunked": pages}, runner="chunked")
    return Backend("local", {"worker": local, "chunked": ForkedChunks(store, folder, chunk_seconds)})
