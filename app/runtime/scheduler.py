"""`Scheduler`: the studio's scheduler. It keeps the queue (the `runs` table), the devices, V*-set sharing, the
supervision of live runs, adoption at start, and stop/resume/delete as lifecycle events (`storage.lifecycle`); a
launcher per runner (`app.runtime.launchers`) starts and watches the runs' processes. Its rules: docs/runtime.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.runtime.checkpoints import remove_checkpoints
from app.runtime.credentials import keep_store_password, split_password
from app.runtime.data_folder import LOG_TAIL_LINES, DataFolder
from app.runtime.devices import Devices
from app.runtime.launchers import Launcher, LaunchFailed, backend_for, worker_command, worker_environment
from app.runtime.reward_versions import warn_changes
from app.runtime.scheduler_lock import KeptLock
from app.runtime.supervision import CLAIM_TIMEOUT, LAUNCH_BACKOFF, STALE_AFTER, WATCHDOG_AFTER, Started, Supervision
from storage import Store, lifecycle
from storage.lifecycle import LIVE
from storage.secrets import scrub_text

if TYPE_CHECKING:
    from a2po.runspec import RunSpec

logger = logging.getLogger("app.runtime.scheduler")


class AlreadyServing(RuntimeError):
    """Another studio process holds this data folder's scheduler lock."""


def describe_spec(spec: dict[str, Any]) -> tuple[str, str]:
    """Display strings (model, dataset) for the runs table."""
    dataset = spec.get("dataset") or {}
    source = dataset.get("source", "arithmetic")
    if source == "arithmetic":
        text = (f"arithmetic ({dataset.get('num_prompts', '?')} prompts, '{dataset.get('operations', '+')}', "
                f"difficulty {dataset.get('difficulty', 1)})")
    else:
        text = str(dataset.get("path") or dataset.get("name") or dataset.get("task") or source)
    return str(spec.get("model", "")), text


class Scheduler(Supervision):
    """Submit, stop, resume and delete runs; start queued runs as the devices allow (docs/runtime.md).

    Args:
        store: the studio database.
        data_dir: the data folder (`app.runtime.data_folder.DataFolder`).
        poll_interval: seconds between two scheduler passes.
        stale_after: seconds without heartbeat after which a worker counts as dead.
        watchdog_after: seconds without progress after which a live worker counts as hung (None: never).
        devices: the GPUs to schedule (default: detected, or the backend's).
        auto_resume: on start, queue interrupted runs again.
        launch_backoff: seconds to wait before each new start of a worker that died before claiming its run.
        claim_timeout: seconds a worker started here may take to claim its run before it is killed.
        worker_env: environment of the workers (default: this process's).
        run_minutes: limit of one run's work since its launch or last Resume: past it, it checkpoints and stops.
        backend: where runs go, passed to `app.runtime.launchers.backend_for`.
    """

    def __init__(self, store: Store, data_dir: str | os.PathLike[str], *, poll_interval: float = 1.0,
                 stale_after: float = STALE_AFTER, watchdog_after: float | None = WATCHDOG_AFTER,
                 devices: Devices | None = None, auto_resume: bool = True,
                 launch_backoff: Iterable[float] = LAUNCH_BACKOFF, claim_timeout: float = CLAIM_TIMEOUT,
                 worker_env: dict[str, str] | None = None, run_minutes: float | None = None, **backend: Any) -> None:
        self.store = store
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.folder = DataFolder(self.data_dir)
        self.backend = backend_for(store, self.folder, self.worker_command, **backend)
        self.devices = self.backend.devices() if self.backend.devices else devices or Devices.detect()
        self.poll_interval, self.stale_after, self.watchdog_after = poll_interval, stale_after, watchdog_after
        self.auto_resume, self.launch_backoff = auto_resume, tuple(launch_backoff)
        self.claim_timeout, self.worker_env, self.run_minutes = claim_timeout, worker_env, run_minutes
        # On a server, its advisory lock; on SQLite beside the file, on local disk (docs/spaces.md).
        self.lock = self.store.scheduler_lock(AlreadyServing)
        self.kept = KeptLock(self.lock, AlreadyServing)
        self.cluster_problem: str | None = None  # why the backend cannot start runs now (it does not answer), or None
        self._lock = threading.RLock()
        self._started: dict[int, Started] = {}
        self._fingerprints: dict[int, str | None] = {}  # run id -> its V* set (`runspec.value_fingerprint_of`)
        self._retry_at: dict[int, float] = {}  # run id -> earliest next start after a launch failure
        self._left_interrupted: set[int] = set()  # lost runs past `MAX_AUTO_RESUMES`, said once, left for a Resume
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        # Called after each pass that holds the lock (the studio sets `Services.advance_studies`: a halving sweep's
        # next rung); this room knows nothing of studies.
        self.after_pass: Callable[[], Any] | None = None
        # Why queued runs may not start now, or None (the studio sets `Policy.disk_problem`: a data folder past its
        # disk quota starts no run, however long ago the run was queued); `queue_held` is the latest answer.
        self.hold_queue: Callable[[], str | None] | None = None
        self.queue_held: str | None = None

    @property
    def lock_problem(self) -> str | None:
        """Why this studio schedules nothing now (its lock is lost), or None."""
        return self.kept.problem

    # ------------------------------------------------------------------ lifecycle

    def start(self, **owner: Any) -> None:
        """Take the scheduler lock (`AlreadyServing` if another studio has it), adopt or settle the live runs,
        resume interrupted ones, then schedule in a background thread."""
        self.reconcile(schedule=True, **owner)

    def close(self) -> None:
        """Stop scheduling and release the lock. Running workers keep running; a later `start()` adopts them."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.kept.release()

    def shutdown(self, grace: float = 25.0) -> list[int]:
        """Stop the deployment: no new starts, every process asked to checkpoint and stop (its run ends
        "interrupted" and is resumed on the next start); wait up to `grace` seconds. Returns the runs asked."""
        self._halt.set()
        stopping = []
        with self._lock:
            for run in self.store.list_runs(status=LIVE):
                launcher = self._launcher(run)
                if not launcher.alive(run) or launcher.followed_elsewhere(run):
                    continue
                self.store.apply(run["id"], lifecycle.REQUEST_STOP, stop_reason="shutdown")
                self.store.add_log(run["id"], "The studio is shutting down: checkpoint and stop; the run resumes "
                                              "when the studio starts again.")
                launcher.ask_to_stop(run)
                stopping.append(run["id"])
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(self._alive(i) for i in stopping):
            with self._lock:
                self._follow()
            time.sleep(0.2)
        with self._lock:
            self._reap()
        self.close()
        return stopping

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the scheduler must outlive one bad pass (e.g. a locked disk)
                logger.exception("Scheduler pass failed; retrying in %.1f s", self.poll_interval)

    def reconcile(self, schedule: bool = True, **owner: Any) -> list[int]:
        """Take the scheduler lock and check every live run against its process, as at app start: a live process is
        adopted; a run whose process is gone was interrupted while no studio watched it. Interrupted runs are
        queued again (with `auto_resume`), files of deleted runs removed. Returns the runs found interrupted."""
        self.kept.acquire(**owner)
        interrupted = []
        with self._lock:
            self._reap()
            for run in self.store.list_runs(status=LIVE):
                launcher = self._launcher(run)
                elsewhere = launcher.followed_elsewhere(run)
                if run["id"] in self._started or launcher.alive(run) or elsewhere:
                    if elsewhere and not launcher.alive(run):
                        logger.warning("Run %s is followed by %s.", run["id"], elsewhere)
                    continue
                if self._gone_unwatched(run, launcher):
                    interrupted.append(run["id"])
            if self.auto_resume:
                for run in self.store.list_runs(status=lifecycle.INTERRUPTED):
                    self._auto_resume(run, "Resumed automatically after the interruption (from its latest "
                                           "checkpoint and stored V* values).")
            self.folder.remove_orphans({r["id"] for r in self.store.list_runs()})
            for run in self.store.list_runs(status=lifecycle.FINISHED):  # a kill between its end and their removal
                remove_checkpoints(self.store, run["id"])
        if schedule and (self._thread is None or not self._thread.is_alive()):
            self._halt.clear()
            self._thread = threading.Thread(target=self._loop, name="a2po-scheduler", daemon=True)
            self._thread.start()
        return interrupted

    def _gone_unwatched(self, run: dict[str, Any], launcher: Launcher) -> bool:
        """A live run whose process was gone when the studio started: interrupted (stopped, if a user had asked).
        True when it is to be resumed."""
        if launcher.settles_runs:
            outcome = launcher.settle(run, launcher.gone_unwatched(run))
            return outcome == "lost" and self.store.get_run(run["id"])["status"] == lifecycle.QUEUED
        user_stop = run["status"] == lifecycle.STOPPING and run.get("stop_reason") in (None, "user")
        message = launcher.gone_unwatched(run)
        event = lifecycle.STOP if user_stop else lifecycle.INTERRUPT
        if self.store.apply(run["id"], event, error=None if user_stop else message,
                            stop_reason="user" if user_stop else "shutdown", finished_at=time.time()):
            self.store.add_log(run["id"], message, level="WARNING")
            return True
        return False

    # ------------------------------------------------------------------ queue

    def submit(self, spec: RunSpec | Mapping[str, Any], owner: str | None = None, admission: Any = None) -> int:
        """Queue a run and return its id: a checked `RunSpec` (the gate's) as it is, or a spec from elsewhere (a
        script, a test), checked here first (`RunSpec.from_dict`). Raises ValueError where the run cannot run here
        (a bad spec, a runner or processes this studio lacks), and nothing is stored then."""
        from a2po.runspec import RunSpec

        run = spec if isinstance(spec, RunSpec) else RunSpec.from_dict(dict(spec))
        if self.backend.runner:
            run = run.with_runner(self.backend.runner)
        clean = run.to_dict()
        if run.runner in self.backend.refused:
            raise ValueError(self.backend.refused[run.runner])
        if self.backend.devices:
            self.devices = self.backend.devices()
        problem = self.backend.check(run.num_processes) if self.backend.check else None
        problem = problem or self.devices.check(run.num_processes, fsdp=bool(run.fsdp))
        if problem:
            raise ValueError(problem)
        model, dataset = describe_spec(clean)
        run_id = self.store.create_run(run.name, run.action, clean, model=model, dataset=dataset, owner=owner,
                                       num_processes=run.num_processes, admission=admission)
        self.store.add_log(run_id, f"Queued: {run.action} {model} on {dataset}.")
        for reward in clean["rewards"]:
            source = reward.get("source")
            if isinstance(source, dict):  # a registered function: which one scores this run
                self.store.add_log(run_id, f"Reward {reward['name']}: {source.get('function')} in "
                                           f"{source.get('file')} (sha256 {str(source.get('sha256'))[:12]}…).")
        return run_id

    def tick(self) -> list[int]:
        """One scheduler pass: reap exited processes, apply what running ones wrote, supervise live runs, start what
        the devices allow (nothing while the scheduler lock is lost). Returns the ids of the runs started."""
        with self._lock:
            if not self.kept.hold():
                return []
            self.cluster_problem = self.backend.each_pass()
            if self.cluster_problem is None and self.backend.devices:
                self.devices = self.backend.devices()
            self._reap()
            self._follow()
            self._supervise()
            self._resume_lost()
            started = self._admit()
            if self.after_pass is not None:
                try:
                    self.after_pass()
                except Exception:  # noqa: BLE001 - a study's bookkeeping must not stop the scheduling of runs
                    logger.exception("The scheduler's after-pass hook failed; it runs again at the next pass")
            return started

    def _admit(self) -> list[int]:
        """Start queued runs in order while their devices are free; the head waits, nothing overtakes it."""
        if self.cluster_problem is not None:
            return []  # queued runs wait for the backend to answer: not launch failures
        self.queue_held = self.hold_queue() if self.hold_queue is not None else None
        if self.queue_held is not None:
            return []
        started = []
        busy = {d for s in self._started.values() for d in s.devices}
        for run in self.store.list_runs(status=LIVE):
            if self._launcher(run).alive(run):
                busy.update((run.get("devices") or "*").split(","))
        queue = sorted(self.store.list_runs(status=lifecycle.QUEUED), key=lambda r: (r["queued_at"], r["id"]))
        sampling = self._stage_ones_under_way() if queue else set()
        for run in queue:
            if run["id"] in self._started:  # started, not claimed yet (or still exiting after a stop and a resume)
                continue
            shared, launcher = self._fingerprint(run), self._launcher(run)
            if shared in sampling:
                # Another run is sampling the V* set this one uses (a sweep's points, a study's seeds): it starts
                # from the stored rows once that stage 1 is done, instead of sampling the same prompts beside it.
                continue
            if not launcher.starts_runs:
                continue  # something else starts it; it takes none of this machine's devices
            if self._retry_at.get(run["id"], 0.0) > time.time():
                break  # the head waits out its back-off; nothing overtakes it
            if (run.get("started_at") or run.get("devices")) and launcher.lingering(run):
                break  # a process an earlier studio started for it still exits, or has yet to claim it
            devices = self.devices.allocate(int(run.get("num_processes") or 1), busy)
            if devices is None:
                break
            if not self._launch(run, devices):
                if run["id"] in self._retry_at:
                    break  # a launch failure: the head waits out its back-off
                continue
            busy.update(devices)
            started.append(run["id"])
            if shared is not None and not self._value_set_complete(shared):
                sampling.add(shared)
        return started

    def _launch(self, run: dict[str, Any], devices: list[str]) -> bool:
        """Start the run's process; False when it did not start (a launch failure is recorded)."""
        launcher = self._launcher(run)
        self._started[run["id"]] = Started(launcher, time.time(), devices)
        try:
            if launcher.start(run, devices, self._worker_env(devices)):
                return True
        except LaunchFailed as error:
            self._launch_failed(run, str(error), output="")
        self._forget(run["id"])
        return False

    def _fingerprint(self, run: dict[str, Any]) -> str | None:
        from a2po.runspec import value_fingerprint_of

        if run["id"] not in self._fingerprints:
            self._fingerprints[run["id"]] = value_fingerprint_of(run.get("config") or {})
        return self._fingerprints[run["id"]]

    def _value_set_complete(self, fingerprint: str) -> bool:
        found = self.store.find_value_set(fingerprint)
        return bool(found and found["complete"])

    def _stage_ones_under_way(self) -> set[str]:
        """The V* sets (fingerprints) that a started run is still sampling: its set is not complete."""
        runs = self.store.list_runs(status=LIVE) + [r for r in map(self.store.get_run, list(self._started)) if r]
        prints = {self._fingerprint(r) for r in runs}
        return {p for p in prints if p is not None and not self._value_set_complete(p)}

    def active_run_ids(self) -> list[int]:
        """Runs with a live process: started here, or live in the database with their process alive."""
        with self._lock:
            ids = [run_id for run_id in self._started if self._alive(run_id)]
            return ids + [r["id"] for r in self.store.list_runs(status=LIVE)
                          if r["id"] not in self._started and self._launcher(r).alive(r)]

    def _worker_env(self, devices: list[str]) -> dict[str, str]:
        base = self.worker_env if self.worker_env is not None else os.environ
        return worker_environment(base, self.devices, devices, self.backend.launchers["worker"].pins_gpus)

    def worker_database(self) -> str:
        """The database as a worker's command line names it: a server's URL without its password, which reaches
        the worker's own store connection only, through a file of the data folder (`keep_store_password`)."""
        if self.store.path is not None:
            return str(self.store.path)
        url, password = split_password(self.store.url)
        keep_store_password(self.data_dir, password)
        return url

    def worker_command(self, run_id: int, spec: dict[str, Any]) -> list[str]:
        """The command that runs a run (`app.runtime.launchers.worker_command`)."""
        return worker_command(self.worker_database(), self.folder, bool(self.devices.gpus), run_id, spec)

    def where(self, address: bool = False) -> dict[str, Any]:
        """Where runs go (for the API's /limits); a cluster's address only with `address` (an admin's)."""
        if self.backend.describe:
            where = self.backend.describe()
            return where if address else {k: v for k, v in where.items() if k != "address"}
        return {"backend": self.backend.name, "devices": self.devices.describe()}

    def worker_output(self, run_id: int, run: dict[str, Any] | None = None, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the run's process output."""
        run = run if run is not None else self.store.get_run(run_id)
        return self._launcher(run).output(run, lines) if run else self.folder.log_tail(run_id, lines)

    def public_text(self, text: str | None) -> str:
        """`text` as a visitor may read it: through the one scrubber (`storage.secrets.scrub_text`), which keeps
        paths inside this studio's data folder and hides the backend's addresses."""
        return scrub_text(text, self.data_dir, self.backend.hidden)

    # ------------------------------------------------------------------ user actions

    def stop(self, run_id: int, reason: str = "user") -> bool:
        """Ask a run to stop: a queued run is stopped at once; a running one stops after its current step (stage 2)
        or batch (stage 1), saving a checkpoint. Returns False if the run was not queued or running."""
        with self._lock:
            if self.store.apply(run_id, lifecycle.CANCEL, stop_reason=reason):
                self.store.add_log(run_id, "Stopped before it started.")
                self._retry_at.pop(run_id, None)
                return True
            run = self.store.get_run(run_id)
            if run is None or run["status"] not in LIVE:
                return False
            launcher = self._launcher(run)
            if not launcher.alive(run):  # nobody left to stop: record it now
                if launcher.settles_runs:
                    self.store.apply(run_id, lifecycle.REQUEST_STOP, stop_reason=reason)
                    launcher.settle(run, "was already gone")
                else:
                    self._end(run_id, lifecycle.STOP, "Stopped; its worker was already gone.", stop_reason=reason)
                return True
            self.store.apply(run_id, lifecycle.REQUEST_STOP, stop_reason=reason)
            self.store.add_log(run_id, "Stop requested.")
            launcher.ask_to_stop(run)
            return True

    def resume(self, run_id: int) -> int:
        """Queue a stopped, interrupted or failed run again; it continues from its latest checkpoint and stored V*
        values. Returns the run id. Raises ValueError when the run cannot be resumed."""
        run = self.store.get_run(run_id)
        if run is None:
            raise ValueError(f"Run {run_id} does not exist (it may have been deleted).")
        if not self.store.apply(run_id, lifecycle.RESUME):
            raise ValueError(f"Run {run_id} is {run['status']}: only stopped, interrupted or failed runs can be "
                             "resumed (and paused runs); submit a new run to train again.")
        self._retry_at.pop(run_id, None)
        self.store.add_log(run_id, "Queued again to resume.")
        warn_changes(self.store, run)
        return run_id

    def delete(self, run_id: int, kill_timeout: float = 10.0) -> bool:
        """Delete a run: end its process if it runs, remove its rows and files (the shared value set stays).
        Returns False if the run did not exist."""
        self._fingerprints.pop(int(run_id), None)  # an id SQLite may give again to a new run
        with self._lock:
            run = self.store.get_run(run_id)
            if run is None:
                return False
            launcher = self._launcher(run)
            launcher.kill(run, timeout=kill_timeout)  # no checkpoint needed, no write after
            in_flight = bool(launcher.followed_elsewhere(run)) and run["status"] in LIVE
            self._forget(run_id)
            self._retry_at.pop(run_id, None)
            self.store.delete_run(run_id)
        # A run followed elsewhere: its follower removes the journal once its process returns.
        self.folder.remove_run(run_id, run["output_dir"], keep_journal=in_flight)
        return True
