"""A Ray cluster's Jobs API, for the Ray launcher (`app.runtime.launchers.ray`, `python -m app --ray-address`).

It is a second way to start and watch a worker process, not a second scheduler: `Scheduler` keeps the queue, the
limits, the supervision and every status change (`storage.lifecycle`), and its launcher asks this module only to
submit a worker (`RayCluster.submit`: the same command and environment a local worker gets, in a job that asks Ray
for the run's GPUs), whether its job still runs (`RayCluster.active`), to stop it (`stop_job`: SIGTERM, and
SIGKILL only after `RAY_JOB_STOP_WAIT_TIME_S`, which the job's environment sets to the studio's shutdown grace so a
checkpoint is never cut short) and for its output (`get_job_logs`). The job id is stored with the run
(`runs.ray_job_id`), so a restarted studio finds its jobs again.

`ray` is imported only here, and only when the studio is started with `--ray-address` (the `cluster` extra).
Every node must see the data folder at the same path, and reach the database (a server, docs/cluster.md).

The cluster's address is the operator's alone: whoever reaches the Jobs API runs any code on the cluster. Every text
this module gives the scheduler for a run (its log, its error, the job's output), or the API, passes through
`RayCluster.redact`; only the start-up messages at the console and `describe()`'s "address" (which the API shows
to signed-in admins only) carry it.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.runtime.devices import Devices

# Job states of Ray's (`ray.job_submission.JobStatus`) in which the entrypoint may still run.
ACTIVE = ("PENDING", "RUNNING")
# How long a status read stays fresh: one scheduler pass asks for a job several times (reap, supervise, devices).
STATUS_TTL = 0.5
NODES_TTL = 10.0  # nodes join and leave rarely; their list is read at most this often
HIDDEN = "<ray-head>"  # what a visitor reads where the cluster's address or host was


def _status(details: Any) -> str:
    """A job's status name ("RUNNING"): `JobStatus` is a str Enum, whose str() is its qualified name."""
    return str(getattr(details.status, "value", details.status))


class RayUnavailable(RuntimeError):
    """The cluster cannot be reached, or Ray is not installed."""


@dataclass(frozen=True)
class Node:
    """An alive node of the cluster: its address and what it offers."""

    ip: str
    cpus: float
    gpus: float
    head: bool


class RayCluster:
    """A Ray cluster reached through its dashboard's Jobs API (`ray.job_submission.JobSubmissionClient`)."""

    def __init__(self, address: str, *, stop_wait_s: float = 25.0) -> None:
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise RayUnavailable("--ray-address needs Ray: pip install 'a2po-studio[cluster]'.") from None
        if not address.startswith(("http://", "https://")):
            raise RayUnavailable(f"--ray-address {address!r}: give the dashboard's address, e.g. "
                                 "http://HEAD_HOST:8265 (the Jobs API; not the GCS port 6379, nor ray://).")
        self.address = address.rstrip("/")
        self.stop_wait_s = stop_wait_s
        parts = urlsplit(self.address)
        # Longest first: the address, then host:port, then the host alone (Ray's and requests' errors quote each).
        hidden = sorted({self.address, parts.netloc, parts.hostname or ""} - {""}, key=len, reverse=True)
        self._hidden = re.compile("|".join(map(re.escape, hidden)), re.IGNORECASE)
        try:
            self.client = JobSubmissionClient(self.address)
        except Exception as error:  # noqa: BLE001 - ConnectionError, or Ray's own errors for a wrong address
            raise RayUnavailable(f"Could not reach the Ray cluster at {self.address}: {error}. Start it (ray start "
                                 "--head --dashboard-host=<private address>) or fix --ray-address.") from None
        self._lock = threading.Lock()
        self._status: dict[str, tuple[float, Any]] = {}
        self._nodes: tuple[float, list[Node]] = (0.0, [])

    def redact(self, text: str) -> str:
        """`text` without the cluster's address or host: for whatever a visitor may read."""
        return self._hidden.sub(HIDDEN, text)

    # ------------------------------------------------------------------ the cluster

    def nodes(self, fresh: bool = False) -> list[Node]:
        """The alive nodes (cached for `NODES_TTL` seconds)."""
        with self._lock:
            read, nodes = self._nodes
            if not fresh and nodes and time.monotonic() - read < NODES_TTL:
                return nodes
        from ray.util.state import list_nodes

        try:
            states = list_nodes(address=self.address, detail=True, raise_on_missing_output=False)
        except Exception as error:  # noqa: BLE001 - the state API raises several kinds when the dashboard is down
            raise RayUnavailable(f"Could not list the nodes of the Ray cluster: {self.redact(str(error))}") from None
        nodes = [Node(ip=s.node_ip, cpus=float(s.resources_total.get("CPU", 0.0)),
                      gpus=float(s.resources_total.get("GPU", 0.0)), head=bool(s.is_head_node))
                 for s in states if s.state == "ALIVE"]
        with self._lock:
            self._nodes = (time.monotonic(), nodes)
        return nodes

    def devices(self) -> Devices:
        """The cluster as the scheduler's devices: its GPUs, all nodes together (Ray places each job on a node
        that has the GPUs it asks for); on a cluster without GPUs, one device, as on a CPU-only machine (one run at
        a time, of at most as many gloo processes as its biggest node has cores)."""
        nodes = self.nodes()
        gpus = int(sum(n.gpus for n in nodes))
        cores = int(max((n.cpus for n in nodes), default=1)) or 1
        return Devices(tuple(f"ray{i}" for i in range(gpus)), cpu_processes=cores)

    def check(self, processes: int) -> str | None:
        """Why a run of `processes` processes (one GPU each, all on one node) can never start on this cluster."""
        nodes = self.nodes()
        if not nodes:
            return "The Ray cluster has no alive node: start one (ray start --address ...)."
        most = max(n.gpus for n in nodes)
        if any(n.gpus for n in nodes) and processes > most:
            return (f"The run asks for {processes} GPUs (one per process, on one node), but the largest node of the "
                    f"Ray cluster has {most:g}: use num_processes of at most {most:g}.")
        return None

    def describe(self) -> dict[str, Any]:
        """Where runs go, for the API's /limits and the start-up message; "address" is for admins only."""
        try:
            nodes = self.nodes()
        except RayUnavailable as error:
            return {"backend": "ray", "address": self.address, "error": str(error)}
        return {"backend": "ray", "address": self.address, "nodes": len(nodes),
                "gpus": int(sum(n.gpus for n in nodes)), "cpus": int(sum(n.cpus for n in nodes))}

    # ------------------------------------------------------------------ jobs

    def submit(self, run_id: int, command: list[str], env: Mapping[str, str], cwd: str, gpus: int) -> str:
        """Submit a worker as a job; returns its id. `gpus` > 0 asks Ray for that many GPUs of one node; a job
        without GPUs asks for one core, so Ray may place it on any node (the entrypoint of a job that asks for
        nothing runs on the head)."""
        job_id = f"a2po-run-{run_id}-{uuid.uuid4().hex[:8]}"
        env_vars = {k: str(v) for k, v in env.items() if not k.startswith("RAY_")}
        # Ray's job supervisor reads this from the job's environment: SIGKILL only after the studio's grace.
        env_vars["RAY_JOB_STOP_WAIT_TIME_S"] = str(max(1, int(self.stop_wait_s)))
        # `exec`: the worker is the entrypoint's process itself, so its pid is the one Ray signals.
        entrypoint = f"cd {shlex.quote(cwd)} && exec {shlex.join(command)}"
        resources: dict[str, Any] = {"entrypoint_num_gpus": gpus} if gpus else {"entrypoint_num_cpus": 1}
        try:
            return self.client.submit_job(entrypoint=entrypoint, submission_id=job_id,
                                          runtime_env={"env_vars": env_vars}, metadata={"a2po_run": str(run_id)},
                                          **resources)
        except Exception as error:  # noqa: BLE001 - connection errors and Ray's RuntimeError for a refused job
            raise RayUnavailable(f"Ray did not accept the job ({self.redact(str(error))})") from None

    def info(self, job_id: str) -> Any:
        """The job's `JobDetails` (status, message, exit code), None when Ray does not know it; cached for
        `STATUS_TTL` seconds. A cluster that cannot be reached raises `RayUnavailable` (never "gone")."""
        now = time.monotonic()
        with self._lock:
            cached = self._status.get(job_id)
            if cached is not None and now - cached[0] < STATUS_TTL:
                return cached[1]
        try:
            details = self.client.get_job_info(job_id)
        except RuntimeError as error:
            if "does not exist" not in str(error) and "404" not in str(error):
                raise RayUnavailable(f"Could not read job {job_id}: {self.redact(str(error))}") from None
            details = None
        except Exception as error:  # noqa: BLE001 - a connection error: the job's state is unknown, not gone
            raise RayUnavailable(f"Could not read job {job_id}: {self.redact(str(error))}") from None
        with self._lock:
            self._status[job_id] = (now, details)
        return details

    def active(self, job_id: str | None) -> bool:
        """Whether the job may still run (pending or running); True too when the cluster cannot be asked now: a job
        is declared gone only on Ray's word."""
        if not job_id:
            return False
        try:
            details = self.info(job_id)
        except RayUnavailable:
            return True
        return details is not None and _status(details) in ACTIVE

    def stop(self, job_id: str) -> None:
        """Ask Ray to stop the job: SIGTERM to its processes, SIGKILL after RAY_JOB_STOP_WAIT_TIME_S."""
        try:
            self.client.stop_job(job_id)
        except Exception:  # noqa: BLE001 - a job that already ended, or vanished, needs no stop
            pass
        with self._lock:
            self._status.pop(job_id, None)

    def logs(self, job_id: str, lines: int = 50) -> str:
        """The last `lines` lines of the job's output ("" when Ray has none)."""
        try:
            text = self.client.get_job_logs(job_id)
        except Exception:  # noqa: BLE001 - a vanished job, or a cluster that cannot be reached: no logs to show
            return ""
        return self.redact("\n".join(text.splitlines()[-lines:]))

    def lost(self, job_id: str) -> bool:
        """Whether an ended job was lost by the cluster rather than ended by its worker: stopped through the Jobs
        API (by someone other than the studio, whose own stops the worker records first), forgotten (a restarted
        head), or failed with no exit code of its entrypoint (its node or supervisor died)."""
        try:
            details = self.info(job_id)
        except RayUnavailable:
            return True
        if details is None:
            return True
        status = _status(details)
        return status == "STOPPED" or (status == "FAILED" and getattr(details, "driver_exit_code", None) is None)

    def ending(self, job_id: str) -> str:
        """How a job ended, in words ("FAILED: ...", "vanished ...")."""
        try:
            details = self.info(job_id)
        except RayUnavailable as error:
            return str(error)
        if details is None:
            return "vanished from the Ray cluster (restarted, or the job was deleted)"
        text = _status(details)
        if getattr(details, "driver_exit_code", None) is not None:
            text += f" with exit code {details.driver_exit_code}"
        if details.message:
            text += f" ({details.message.strip()})"
        return self.redact(text)
