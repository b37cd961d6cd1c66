"""The supervision half of the scheduler: processes started here until their run's state is final, live runs
watched every pass (gone, silent, hung, past the time limit), launch failures and their back-off, runs interrupted
and resumed (docs/runtime.md, "Supervision"). `app.runtime.scheduler.Scheduler` is the class that uses it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.runtime.data_folder import LOG_TAIL_LINES, DataFolder
from app.runtime.launchers import LOST, Backend, Ending, Launcher
from app.runtime.reward_versions import warn_changes
from app.runtime.worker import HEARTBEAT_INTERVAL
from storage import Store, lifecycle
from storage.lifecycle import LIVE

# A worker whose heartbeat is older than this is considered dead (heartbeats come every HEARTBEAT_INTERVAL).
STALE_AFTER = max(60.0, 20 * HEARTBEAT_INTERVAL)
# A live worker with no progress for this long is considered hung. Long enough for a slow first model download or
# a long CPU step; `python -m app --watchdog-minutes` changes it.
WATCHDOG_AFTER = 30 * 60.0
LAUNCH_BACKOFF = (2.0, 8.0, 30.0)  # seconds before the 2nd, 3rd and 4th start; then the run fails
# A worker started here that has not claimed its run after this long is killed: a launch failure with the reason.
CLAIM_TIMEOUT = 120.0

logger = logging.getLogger("app.runtime.scheduler")


@dataclass
class Started:
    """A process started here for a run, until its run's state is final."""

    launcher: Launcher
    at: float  # when (a claim since then means this start worked)
    devices: list[str] = field(default_factory=list)



class Supervision:
    """What the scheduler does to live runs each pass; the scheduler sets these attributes."""

    store: Store
    folder: DataFolder
    backend: Backend
    stale_after: float
    watchdog_after: float | None
    launch_backoff: tuple[float, ...]
    claim_timeout: float
    run_minutes: float | None
    auto_resume: bool
    cluster_problem: str | None
    _started: dict[int, Started]
    _retry_at: dict[int, float]
    _left_interrupted: set[int]
    _halt: threading.Event

    def public_text(self, text: str | None) -> str:
        raise NotImplementedError

    def stop(self, run_id: int, reason: str = "user") -> bool:
        raise NotImplementedError

    def _launcher(self, run: dict[str, Any]) -> Launcher:
        started = self._started.get(run["id"])
        return started.launcher if started else self.backend.launcher_for(run)

    def _alive(self, run_id: int) -> bool:
        run = self.store.get_run(run_id)
        return bool(run) and self._launcher(run).alive(run)

    def _forget(self, run_id: int) -> None:
        started = self._started.pop(run_id, None)
        if started is not None:
            started.launcher.forget(run_id)

    def _follow(self) -> None:
        """Apply what running processes wrote since the last pass (the heartbeat and progress come with it)."""
        for run in self.store.list_runs(status=LIVE):
            launcher = self._launcher(run)
            if not launcher.followed_elsewhere(run):
                try:
                    launcher.follow(run)
                except Exception:  # noqa: BLE001 - a torn or busy write now is applied by the next pass
                    logger.exception("Applying what run %s wrote failed", run["id"])

    def _reap(self) -> None:
        """Settle processes started here that ended. Each is forgotten only once its run's state is final."""
        for run_id, started in list(self._started.items()):
            run = self.store.get_run(run_id)
            ending = started.launcher.ending(run) if run is not None else None
            if run is not None and ending is None and started.launcher.alive(run):
                continue
            if ending is not None and run["status"] == lifecycle.QUEUED and not self._claimed_since_launch(run):
                self._launch_failed(run, f"{ending.how} before starting the run", started.launcher.output(run))
            elif ending is not None and run["status"] in LIVE:
                self._gone(run, started.launcher, ending)
            self._forget(run_id)

    def _gone(self, run: dict[str, Any], launcher: Launcher, ending: Ending) -> None:
        """A live run whose process ended without recording an end."""
        if launcher.settles_runs:
            launcher.settle(run, ending.how)
            self._forget(run["id"])
        elif ending.kind == LOST:
            self._end(run["id"], lifecycle.INTERRUPT, ending.message, stop_reason="lost")
        else:
            self._end(run["id"], lifecycle.FAIL, ending.message)

    def _resume_lost(self) -> None:
        """Queue again runs interrupted while a studio watched by something other than a shutdown (stop reason
        "lost"), as a restart resumes interrupted runs."""
        if not self.auto_resume or self._halt.is_set():
            return
        waits = " once the cluster answers" if self.cluster_problem else ""
        for run in self.store.list_runs(status=lifecycle.INTERRUPTED):
            if run.get("stop_reason") == "lost":
                self._auto_resume(run, f"Resumed automatically{waits} (from its latest checkpoint and stored V* "
                                       "values).")

    def _auto_resume(self, run: dict[str, Any], resumed: str) -> None:
        """Queue an interrupted run again at its old place, at most `MAX_AUTO_RESUMES` times in a row without
        progress; past that, say so once and leave it for a Resume."""
        if not lifecycle.may_auto_resume(run):
            if run["id"] not in self._left_interrupted:
                self._left_interrupted.add(run["id"])
                self.store.add_log(run["id"], f"Interrupted {run['auto_resumes'] + 1} times in a row without "
                                              "progress in between: not resumed automatically again; press Resume "
                                              "to continue it.", level="WARNING")
            return
        self._left_interrupted.discard(run["id"])
        if self.store.apply(run["id"], lifecycle.AUTO_RESUME):
            self.store.add_log(run["id"], resumed)
            warn_changes(self.store, run)

    def _claimed_since_launch(self, run: dict[str, Any]) -> bool:
        """Whether the run was claimed after its process in `_started` started (that launch worked)."""
        started = self._started.get(run["id"])
        return started is not None and (run.get("started_at") or 0.0) >= started.at

    def _launch_failed(self, run: dict[str, Any], what: str, output: str | None = None) -> None:
        failures = run["launch_failures"] + 1
        output = self.public_text(self.folder.log_tail(run["id"]) if output is None else output)
        if failures > len(self.launch_backoff):
            self._retry_at.pop(run["id"], None)
            message = (f"The worker {what}, {failures} times in a row; giving up. Last lines of its output:\n"
                       f"{output}")
            if self.store.apply(run["id"], lifecycle.FAIL_LAUNCH, error=message):
                self.store.add_log(run["id"], message, level="ERROR")
            return
        wait = self.launch_backoff[failures - 1]
        self._retry_at[run["id"]] = time.time() + wait
        if self.store.apply(run["id"], lifecycle.LAUNCH_RETRY):
            self.store.add_log(run["id"], f"The worker {what}; trying again in {wait:.0f} s ({failures} of "
                                          f"{len(self.launch_backoff)} retries).", level="WARNING")

    def _supervise(self) -> None:
        """Kill processes that never claim their run; fail (or settle) runs whose process is gone, silent (no
        heartbeat) or hung (no progress); stop runs past the time limit (docs/runtime.md, "Supervision")."""
        now = time.time()
        for run_id, started in list(self._started.items()):
            run = self.store.get_run(run_id)
            if (run is not None and run["status"] == lifecycle.QUEUED and not self._claimed_since_launch(run)
                    and started.launcher.alive(run) and now - started.at > self.claim_timeout):
                started.launcher.kill(run)
                self._launch_failed(run, f"did not claim the run within {self.claim_timeout:.0f} s of its start "
                                         "(killed)")
                self._forget(run_id)
        for run in self.store.list_runs(status=LIVE):
            launcher = self._launcher(run)
            if run["id"] in self._started and not launcher.alive(run):
                continue  # ended just now: `_reap` settles it on the next pass
            if not launcher.followed_elsewhere(run):
                self._watch(run, launcher, now)

    def _watch(self, run: dict[str, Any], launcher: Launcher, now: float) -> None:
        run_id = run["id"]
        ending = launcher.ending(run)
        if ending is not None:
            self._gone(run, launcher, ending)
            return
        beat = run["heartbeat_at"] or run["started_at"] or now
        progress = run["progress_at"] or run["started_at"] or now
        worked = (run["limit_seconds"] or 0.0) + now - (run["started_at"] or now)
        out_of_reach = launcher.out_of_reach(run, now - beat) if now - beat > self.stale_after else None
        if out_of_reach:
            self._end(run_id, lifecycle.INTERRUPT, out_of_reach, stop_reason="lost")
        elif now - beat > self.stale_after:
            launcher.kill(run)
            how = f"no heartbeat for {now - beat:.0f} s ({launcher.describe(run)} killed)"
            if launcher.settles_runs:
                launcher.settle(run, how)
                self._forget(run_id)
            else:
                self._end(run_id, lifecycle.FAIL, f"Worker died: {how}.")
        elif self.run_minutes is not None and run["status"] == lifecycle.RUNNING and worked > self.run_minutes * 60:
            self.store.add_log(run_id, f"The studio's limit of {self.run_minutes:g} minutes per run is reached: "
                                       "checkpoint and stop (Resume continues it).", level="WARNING")
            self.stop(run_id, reason="limit")
        elif self.watchdog_after is not None and now - progress > self.watchdog_after:
            launcher.kill(run)
            logs = "\n".join(f"{x['level']} {x['message']}" for x in self._last_logs(run_id))
            self._end(run_id, lifecycle.FAIL, f"Watchdog: the worker ({launcher.describe(run)}) was alive but made no "
                                              f"progress for {now - progress:.0f} s (no stage-1 batch, training "
                                              f"step, evaluation or checkpoint; limit {self.watchdog_after:.0f} s), "
                                              f"so it was killed. Its last log lines:\n{logs}", stop_reason="watchdog")

    def _last_logs(self, run_id: int) -> list[dict[str, Any]]:
        last = self.store.last_ids(run_id)["logs"]
        return self.store.get_logs(run_id, after_id=max(0, last - LOG_TAIL_LINES))

    def _end(self, run_id: int, event: lifecycle.Event, message: str, **fields: Any) -> bool:
        """End a live run by `event` with `message` as its error (ERROR log line too); what its process wrote and
        was not applied yet is applied first, so it is kept."""
        run = self.store.get_run(run_id)
        if run is not None:
            self._launcher(run).follow(run)
        message = self.public_text(message)  # a dead worker's log tail: its command line names the database
        if self.store.apply(run_id, event, error=message, **fields):
            self.store.add_log(run_id, message, level="ERROR" if event is lifecycle.FAIL else "WARNING")
            self.folder.clear_journal(run_id)
            self.store.reset_journal(run_id)
            self._forget(run_id)
            return True
        return False
