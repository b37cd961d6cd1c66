"""ZeroGPU mode: on a ZeroGPU Space the chunks of a run (`app.runtime.chunks`) run inside a `@spaces.GPU` function,
called from the Run page of the visitor who launched the run, so that visitor's daily GPU quota pays for them.

- **Detection.** `SPACES_ZERO_GPU` set to true (ZeroGPU sets it; the `spaces` package reads the same variable).
- **The wrapped function.** `gpu_chunk` is `app.runtime.chunks.run_chunk` behind `spaces.GPU(duration=gpu_duration)`,
  wrapped once, when this module is imported (ZeroGPU wants its GPU functions known before `demo.launch()`); the
  duration is a callable of the call's arguments: the chunk's budget plus `CHUNK_MARGIN` (restore, the step under
  way at the deadline, the checkpoint), rounded up. It is the only function this studio wraps. Without the `spaces`
  package, or with it outside ZeroGPU (where `spaces.GPU` returns the function unchanged), `gpu_chunk` is the plain
  function and nothing changes.
- **Each call** runs, on ZeroGPU, in a process forked from the studio's (ZeroGPU may keep it for the next call):
  its arguments and result are plain data, it never opens the database (`app.runtime.journal`: the page's process claims
  the run and writes the chunk's input before the call, and applies the chunk's journal during and after it),
  keeps nothing in memory, and drops credentials from its environment first (a run executes user-chosen models
  and data).

`ChunkDriver` is what the Run page calls on its timer (`app.web.pages.chunks`): for the run on screen, if it is chunked,
queued or paused, and the visitor may drive it (they launched it, or nobody signed in launched it), it claims the
run (with this process's pid, the driving thread named as a chunk's, so the scheduler sees it alive), calls
`gpu_chunk`, and settles the run when the call returns or fails (`app.runtime.chunks.settle`); one call at a time per
run in this process. While the call runs, its journal is applied every `INGEST_EVERY` seconds (the page shows the
chunk's progress) and the run's heartbeat is kept fresh (waiting for a GPU is not a dead run). A stop or a delete
asks the chunk to stop through its stop file: no process of ZeroGPU's is ever signalled. A call that fails (no GPU
quota left, ZeroGPU's own errors) is shown on the page and retried after `RETRY_AFTER` seconds. While the scheduler
holds its queue (no disk to spare), pages start no chunk either, and say why.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

from app.runtime import chunks
from app.runtime.chunks import CHUNK_MARGIN, DEFAULT_BUDGET, READY, is_chunked, progress_of, run_chunk
from storage import lifecycle

ENV = "SPACES_ZERO_GPU"
RETRY_AFTER = 60.0  # seconds before a page retries a chunk whose GPU call failed
INGEST_EVERY = 1.0  # seconds between two applications of a running chunk's journal


def enabled(environ: dict[str, str] | None = None) -> bool:
    """True on a ZeroGPU Space (`SPACES_ZERO_GPU` is 1, t or true, as the `spaces` package reads it)."""
    return (environ if environ is not None else os.environ).get(ENV, "").lower() in ("1", "t", "true")


def gpu_duration(data_dir: str, run_id: int, budget_seconds: float = DEFAULT_BUDGET,
                 keep_hub_token: bool = False) -> int:
    """Seconds of GPU a chunk asks ZeroGPU for: its budget plus the margin for restoring and saving, rounded up
    (a callable of the call's own arguments, as `spaces.GPU(duration=...)` accepts)."""
    return int(math.ceil(float(budget_seconds) + CHUNK_MARGIN))


def _scrub_environment(keep_hub_token: bool) -> None:
    """Remove credentials from this process's environment (as `app.access.policy.Policy.worker_environment` does for
    workers): the chunk runs user-chosen models, data and settings."""
    from app.access.policy import without_secrets

    for name in set(os.environ) - set(without_secrets(os.environ, keep_hub_token)):
        del os.environ[name]


def chunk_on_gpu(data_dir: str, run_id: int, budget_seconds: float = DEFAULT_BUDGET,
                 keep_hub_token: bool = False) -> dict[str, Any]:
    """One chunk of a claimed run (`app.runtime.chunks.run_chunk`), as ZeroGPU runs it: plain arguments, plain
    result."""
    import gc

    from a2po._faults import rearm

    gc.freeze()  # as in a forked chunk (`app.runtime.chunks._child`): no finalizer of an inherited object runs here
    try:
        _scrub_environment(keep_hub_token)
        rearm()
        return run_chunk(data_dir, int(run_id), float(budget_seconds))
    finally:
        gc.unfreeze()  # ZeroGPU may keep this process for the next call


def wrap(spaces_module: Any = None):
    """`chunk_on_gpu` behind `spaces.GPU(duration=gpu_duration)` (`spaces_module`, else the installed `spaces`
    package); the plain function when the package is missing."""
    if spaces_module is None:
        try:
            import spaces as spaces_module
        except ImportError:
            return chunk_on_gpu
    return spaces_module.GPU(duration=gpu_duration)(chunk_on_gpu)


gpu_chunk = wrap()


class ChunkDriver:
    """Runs the next chunk of a run for the page that shows it (see the module docstring)."""

    def __init__(self, services: Any, budget_seconds: float | None = None) -> None:
        self.services = services
        chunked = self._backend.launchers.get("chunked") if self._backend is not None else None
        self.budget = float(budget_seconds if budget_seconds is not None else
                            getattr(chunked, "budget", DEFAULT_BUDGET))
        self._lock = threading.Lock()
        self._driving: set[int] = set()
        self._failed: dict[int, tuple[float, str]] = {}  # run id -> (when, why) of the last failed call

    @property
    def active(self) -> bool:
        """Pages drive chunks only in ZeroGPU mode (elsewhere the scheduler does)."""
        return getattr(self._backend, "name", None) == "zerogpu"

    @property
    def _backend(self) -> Any:
        """Where the scheduler sends runs (`app.runtime.launchers.Backend`); None without a scheduler."""
        return getattr(self.services.scheduler, "backend", None)

    def may_drive(self, run: dict[str, Any], user: Any) -> bool:
        """The visitor who launched the run (their quota pays), or anyone for a run nobody signed in launched."""
        owner = run.get("owner")
        return owner is None or (user is not None and getattr(user, "name", None) == owner)

    def held(self) -> str | None:
        """Why no chunk may start now, or None: the scheduler's hold on its queue (a data folder past its disk
        quota, or a nearly full disk: `Policy.disk_problem`), which pages obey as the scheduler does."""
        hold = getattr(self.services.scheduler, "hold_queue", None)
        return hold() if hold is not None else None

    def status(self, run_id: int) -> dict[str, Any] | None:
        """Where the run stands (`app.runtime.chunks.progress_of`), with `driving` and the last call's error, or
        None."""
        run = self.services.store.get_run(int(run_id))
        if run is None:
            return None
        out = progress_of(self.services.store, run)
        failed = self._failed.get(run["id"])
        out.update(chunked=is_chunked(run), driving=run["id"] in self._driving, zerogpu=self.active,
                   last_error=failed[1] if failed else None, held=self.held(), budget=self.budget,
                   gpu_duration=gpu_duration("", run["id"], self.budget))
        return out

    def drive(self, run_id: int | None, user: Any = None, function=None) -> dict[str, Any] | None:
        """Run the next chunk of `run_id` if it is due (see the class docstring); returns `status` afterwards.
        Blocks for the chunk's duration."""
        if run_id is None:
            return None
        store = self.services.store
        run = store.get_run(int(run_id))
        if run is None:
            return None
        run_id = run["id"]
        due = (self.active and is_chunked(run) and run["status"] in READY and self.may_drive(run, user)
               and time.time() - self._failed.get(run_id, (0.0, ""))[0] > RETRY_AFTER and self.held() is None)
        if not due:
            return self.status(run_id)
        with self._lock:
            if run_id in self._driving:
                return self.status(run_id)
            self._driving.add(run_id)
        try:
            self._drive(store, run_id, function or gpu_chunk)
        finally:
            with self._lock:
                self._driving.discard(run_id)
        return self.status(run_id)

    def _drive(self, store, run_id: int, function) -> None:
        data_dir = str(self.services.data_dir)
        if store.apply(run_id, lifecycle.UNPAUSE):
            store.add_log(run_id, "Its page is open again: the next chunk goes on with the run.")
        run = store.get_run(run_id)
        if run is None or run["status"] != lifecycle.QUEUED:
            return
        with chunks.named_thread(chunks.thread_name(run_id)):
            if chunks.claim(store, data_dir, run, pid=os.getpid(), devices="zerogpu") is None:
                return
            store.add_log(run_id, f"Chunk {run['chunks_done'] + 1} asked for a ZeroGPU call of "
                                  f"{gpu_duration(data_dir, run_id, self.budget)} s.")
            done = threading.Event()

            def follow() -> None:  # the chunk's progress on the page as it goes; waiting for a GPU is not dying
                while not done.wait(INGEST_EVERY):
                    try:
                        chunks.ingest(store, data_dir, run_id)
                        store.heartbeat(run_id)
                    except Exception as error:  # noqa: BLE001 - a busy database: the next pass applies it
                        store.add_log(run_id, f"Applying the chunk's journal failed: {error}", level="WARNING")

            follower = threading.Thread(target=follow, name=f"follow-{run_id}", daemon=True)
            follower.start()
            policy = getattr(self.services, "policy", None)
            started = time.monotonic()
            how = "ended without writing how"
            try:
                result = function(data_dir, run_id, self.budget, bool(policy and policy.allow_hub_push))
                self._failed.pop(run_id, None)
                if isinstance(result, dict) and result.get("outcome") == "not-started":
                    how = "found no input"
            except Exception as error:  # noqa: BLE001 - no quota left, a GPU that could not be had: say so, retry
                message = f"{type(error).__name__}: {error}"
                self._failed[run_id] = (time.time(), message)
                how = f"failed after {time.monotonic() - started:.0f} s ({message})"
                store.add_log(run_id, f"The GPU call for the chunk {how}. The page tries again in "
                                      f"{RETRY_AFTER:.0f} s.", level="WARNING")
            finally:
                done.set()
                follower.join(timeout=30)
            if run_id in self._failed and not chunks.started(data_dir, run_id):
                # No GPU for it: not a chunk that died, and not a restart to count.
                chunks.ingest(store, data_dir, run_id)
                store.apply(run_id, lifecycle.RELEASE)
                return
            chunks.settle(store, data_dir, run_id, how, paused=True)
