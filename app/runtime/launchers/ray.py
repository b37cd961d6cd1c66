"""Ray jobs: the worker command submitted to a Ray cluster's Jobs API (`python -m app --ray-address`); the cluster's
GPUs are the devices, the job's status says whether the worker lives, Ray's `stop_job` stops it (docs/runtime.md,
"Ray jobs"; docs/cluster.md). `app.runtime.ray_backend` is the only module that imports `ray`."""

from __future__ import annotations

import logging
from typing import Any

from app.runtime.data_folder import TOKEN_ENV, DataFolder
from app.runtime.launchers.base import FAILED, LOST, Ending, Launcher, LaunchFailed, processes_of
from app.runtime.launchers.local import LocalWorkers
from app.runtime.ray_backend import RayCluster, RayUnavailable
from storage import Store

logger = logging.getLogger("app.runtime.scheduler")


class RayWorkers(Launcher):
    """Workers as Ray jobs. A run whose worker is not a Ray job (started by a studio without `--ray-address`) is
    watched as a local worker (`local`)."""

    pins_gpus = False  # Ray sets CUDA_VISIBLE_DEVICES for the GPUs it gives a job

    def __init__(self, store: Store, folder: DataFolder, command: Any, cluster: RayCluster,
                 local: LocalWorkers) -> None:
        super().__init__(store, folder)
        self.command = command
        self.cluster = cluster
        self.local = local
        self.jobs: dict[int, str] = {}  # run id -> the job submitted here
        self.problem: str | None = None  # why the cluster cannot be used now (it does not answer), or None

    def start(self, run: dict[str, Any], devices: list[str], env: dict[str, str]) -> bool:
        """Submit the run's worker as a job; a job Ray refuses, or a cluster that cannot be reached, is a launch
        failure (`LaunchFailed`)."""
        run_id, spec = run["id"], run.get("config") or {}
        cwd = str(self.folder.make_worker_cwd())  # the data folder exists before its mark is written
        env = {**env, TOKEN_ENV: self.folder.token()}
        try:
            gpus = processes_of(spec) if self.cluster.devices().gpus else 0
            job_id = self.cluster.submit(run_id, self.command(run_id, spec), env, cwd, gpus)
        except RayUnavailable as error:
            raise LaunchFailed(f"could not be submitted to the Ray cluster: {error}") from None
        self.jobs[run_id] = job_id
        self.store.update_run(run_id, devices=",".join(devices), ray_job_id=job_id)
        asked = f"{gpus} GPU(s)" if gpus else "1 CPU"
        # Every visitor reads a run's log: the cluster's address stays in the studio's own log.
        logger.info("Run %s: submitted to the Ray cluster at %s as job %s.", run_id, self.cluster.address, job_id)
        self.store.add_log(run_id, f"Worker submitted to the Ray cluster as job {job_id} (asking for {asked}); its "
                                   "output is the job's log.")
        return True

    def job(self, run: dict[str, Any]) -> str | None:
        """The run's job: the one submitted here, else the run's own; None for a run with no job (a local worker)."""
        return self.jobs.get(run["id"]) or run.get("ray_job_id") or None

    def alive(self, run: dict[str, Any]) -> bool:
        job = self.job(run)
        return self.cluster.active(job) if job else self.local.alive(run)

    def ending(self, run: dict[str, Any]) -> Ending | None:
        job = self.job(run)
        if not job:
            return self.local.ending(run)
        if run["id"] in self.jobs and run.get("ray_job_id") not in (None, job):
            return None  # the run names another job: this one's end says nothing of it
        if self.cluster.active(job):
            return None
        how = self.cluster.ending(job)
        if self.cluster.lost(job):
            return Ending(LOST, f"(Ray job {job}) ended {how}",
                          f"The Ray cluster lost the worker: its job {job} ended {how}. Interrupted; the studio "
                          "resumes it from its latest checkpoint.")
        return Ending(FAILED, f"(Ray job {job}) ended {how}",
                      f"The Ray job {job} of the worker ended {how} without recording an end; last lines of its "
                      f"output:\n{self.output(run)}")

    def ask_to_stop(self, run: dict[str, Any]) -> None:
        """Ray's `stop_job`: SIGTERM, then SIGKILL after the shutdown grace."""
        job = self.job(run)
        if job:
            self.cluster.stop(job)
        else:
            self.local.ask_to_stop(run)

    def kill(self, run: dict[str, Any], timeout: float = 10.0) -> None:
        """Ray has no kill: a stop, whose SIGKILL comes after the grace, and a wait for it."""
        job = self.job(run)
        if not job:
            self.local.kill(run, timeout)
            return
        if not self.cluster.active(job):
            return
        self.cluster.stop(job)
        deadline = self.monotonic() + timeout
        while self.cluster.active(job) and self.monotonic() < deadline:
            self.sleep(0.2)

    def output(self, run: dict[str, Any], lines: int = 20) -> str:
        job = self.job(run)
        return self.cluster.logs(job, lines) if job else self.local.output(run, lines)

    def forget(self, run_id: int) -> None:
        self.jobs.pop(run_id, None)
        self.local.forget(run_id)

    def gone_unwatched(self, run: dict[str, Any]) -> str:
        job = self.job(run)
        if not job:
            return self.local.gone_unwatched(run)
        return f"The worker's Ray job {job} ended while no studio was watching: {self.cluster.ending(job)}."

    def lingering(self, run: dict[str, Any]) -> bool:
        job = self.job(run)
        return self.cluster.active(job) if job else self.local.lingering(run)

    def out_of_reach(self, run: dict[str, Any], silent_for: float) -> str | None:
        """Its job cannot be asked about or stopped while the cluster does not answer: the head is down, and the
        worker most likely with it. The run starts again only once the cluster answers and no job of it runs."""
        if self.problem is None or not self.job(run):
            return None
        return (f"The Ray cluster does not answer and the worker's heartbeat stopped {silent_for:.0f} s ago: "
                "interrupted; the studio resumes it once the cluster answers.")

    def each_pass(self) -> str | None:
        """Ask the cluster whether it answers; say so once when that changes."""
        try:
            self.cluster.devices()
        except RayUnavailable as error:  # the next pass asks again
            if self.problem is None:
                logger.error("The Ray cluster does not answer: no run starts until it does (%s).", error)
            self.problem = str(error)
            return self.problem
        if self.problem is not None:
            logger.warning("The Ray cluster answers again: scheduling goes on.")
        self.problem = None
        return None
