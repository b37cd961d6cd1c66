"""`JobManager`: the dashboard's scheduler. Runs queued jobs in worker processes, as the machine's devices allow.

The queue is the `runs` table, so it survives an app restart, and the database is the one truth about what runs:

- **One scheduler per database.** `start()` takes an exclusive `flock` on `scheduler.lock` next to the database
  (in the data folder unless `--db-dir` moved the database to local disk, see `app.runtime.snapshot`) (the
  kernel drops it when the process dies, however it dies); a second app on the same folder is refused with the
  first one's pid and address (`AlreadyServing`). Workers never inherit the lock. On a PostgreSQL server the lock
  (an advisory lock) goes with its connection when the server restarts, and another studio may take it then: every
  pass checks it first, and without it the scheduler starts, supervises and reaps nothing (another studio's
  workers would look gone from here) and says why (`lock_problem`, the pages' banner, the log) until it takes the
  lock back.
- **Devices.** A run of `num_processes` processes (default 1) takes as many GPUs (`runs.num_processes`); it starts
  only when that many are free, counting every run the database says is running with a live worker, whoever
  started it. On a CPU-only machine the machine is one device: one run at a time, of 1 process or of several
  gloo processes (at most one per core). The queue is served strictly in order (the head waits for its
  devices; nothing overtakes it, so nothing starves). The worker sees only its GPUs (`CUDA_VISIBLE_DEVICES`).
- **Several processes.** Such a run's worker runs under `accelerate launch` (`worker_command`); the launcher is
  the process the scheduler starts and watches, and the run's pid. A stop signals its processes, a kill reaches
  them all, and the launcher exits (failing the run) when any of them dies.
- **Supervision**, every `poll_interval` seconds, of every active run: a worker that is gone fails its run; a
  worker whose heartbeat stopped is killed and fails; a worker that is alive and heartbeating but made no
  progress (no stage-1 batch, training step, evaluation or checkpoint) for `watchdog_after` seconds, such as a
  hung main thread, is killed and fails with its last log lines. A run is forgotten only once its final state is
  written.
- **Launch failures.** A worker that exits before claiming its run (database locked, out of memory at start-up),
  or has not claimed it `claim_timeout` seconds after its start (then it is killed), is started again after a
  back-off (`launch_backoff`), and after the last one the run fails with the reason and the tail of the worker's
  output: never a relaunch loop, never a run left "queued" behind a process that does nothing.
- **One state machine.** Every change of a run's status is an event of `storage.lifecycle`, which also says what
  the counters (`auto_resumes`, `launch_failures`, `limit_seconds`, ...) mean.
- **Restarts and shutdowns.** Workers run in their own session: an app that exits (or crashes, or is restarted
  by hand) leaves them running, and the next app adopts them. A stop of the whole deployment is different:
  `shutdown()` (the app calls it on SIGTERM, which is what `docker stop` and a Space restart send) asks every
  worker to save a checkpoint and stop; their runs end "interrupted". On start the manager resumes interrupted
  runs, and runs whose worker vanished while no app was watching, at the head of the queue (`auto_resume`, at
  most `MAX_AUTO_RESUMES` times in a row per run). A worker that dies while the app watches fails its run
  instead: it would likely die again.
- **Chunked runs** (`"runner": "chunked"`, `app.runtime.chunks`). The scheduler runs them chunk after chunk, each in a
  freshly forked copy of this process (`chunk_seconds` of work each), which never touches the database: the
  scheduler claims the run and writes the chunk's input before the fork, applies the chunk's journal on every
  pass (`app.runtime.journal`), and settles the run when the chunk's process is gone; after a chunk the run is queued
  again at its old place, so it goes on next. A chunk process that dies (killed, out of memory) loses only what
  it had not written: the run is queued again and the next chunk continues, at most `MAX_AUTO_RESUMES` times in
  a row (then it fails). A chunk is supervised as a worker is (pid, heartbeat, watchdog); its process is
  recognised by its thread's name. A stop reaches a chunk through its stop file (and SIGTERM). The per-run time
  limit counts the seconds of all its chunks since its launch or last Resume. In **ZeroGPU mode** (`zerogpu`, a
  ZeroGPU Space: no process of this studio ever gets a GPU) the scheduler starts no chunk: the Run page of the
  visitor who launched a run calls them (`app.runtime.zerogpu`), every run is chunked, and a queued run that no page
  drove for `pause_after` seconds becomes "paused" (as does one whose chunk process died); opening its page goes
  on with it. A chunk there runs in a process of ZeroGPU's,
  which the studio never signals: its page's thread claims and settles it, and a stop, a delete or the watchdog
  only asks it to stop (its GPU call's duration bounds it). Start-up reconciliation leaves paused runs alone.
- **On a Ray cluster** (`ray`, `python -m app --ray-address`, `app.runtime.ray_backend`). The same scheduler, with
  another way to start and watch a worker: the same worker command and environment, submitted as a Ray job that
  asks for the run's GPUs (the cluster's GPUs are the devices; a cluster without GPUs is one device, as a CPU-only
  machine is). The job's id is the run's `ray_job_id`; whether the worker lives is the job's status (not /proc), a
  stop is Ray's `stop_job` (SIGTERM, then SIGKILL after the shutdown grace), the tail of a dead worker's output is
  the job's log. Everything else (queue, limits, heartbeats, watchdog, adoption, every status change) is as for a
  local worker, with one difference: a job the cluster lost (stopped through Ray by someone else, forgotten by a
  restarted head, failed with no exit code because its node died) interrupts its run, which is resumed; while the
  cluster does not answer (`cluster_problem`) nothing starts, and a run whose heartbeat stops meanwhile is
  interrupted and resumed once it answers. Chunked runs fork the studio's own process, so they are refused there.
- **Stops from outside.** A worker stopped by a SIGTERM the studio did not send (no stop reason on its run) records
  the run "interrupted" (reason "lost"), and the scheduler resumes it, as it resumes runs after a restart.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.access.policy import SECRET_ENV
from app.runtime import chunks, journal
from app.runtime.checkpoints import remove_checkpoints
from app.runtime.chunks import DEFAULT_BUDGET, ForkedChunk, fork_chunk, is_chunk_of, is_chunked
from app.runtime.credentials import PASSED_SECRETS_ENV, keep_store_password, split_password
from app.runtime.data_folder import LOG_TAIL_LINES, TOKEN_ENV, DataFolder, tail
from app.runtime.devices import Devices
from app.runtime.processes import is_worker_of, launched_processes, pid_alive, with_project_path
from app.runtime.ray_backend import RayCluster, RayJob, RayUnavailable
from app.runtime.worker import HEARTBEAT_INTERVAL
from storage import Store, lifecycle
from storage.lifecycle import LIVE
from storage.secrets import scrub_text

# A worker whose heartbeat is older than this is considered dead (heartbeats come every HEARTBEAT_INTERVAL).
STALE_AFTER = max(60.0, 20 * HEARTBEAT_INTERVAL)
# A live worker with no progress for this long is considered hung. Long enough for a slow first model download or
# a long CPU step; `python -m app --watchdog-minutes` changes it.
WATCHDOG_AFTER = 30 * 60.0
LAUNCH_BACKOFF = (2.0, 8.0, 30.0)  # seconds before the 2nd, 3rd and 4th start; then the run fails
# A worker started here that has not claimed its run after this long is killed: a launch failure with the reason.
CLAIM_TIMEOUT = 120.0
PAUSE_AFTER = 20.0  # ZeroGPU mode: seconds a queued run waits for a page to drive it before it is paused
LAUNCHER_SHUTDOWN_TIMEOUT = 120  # seconds an `accelerate launch` asked to stop gives its processes to checkpoint

logger = logging.getLogger("app.runtime.scheduler")


class AlreadyServing(RuntimeError):
    """Another studio process holds this data folder's scheduler lock."""


def processes_of(spec: dict[str, Any]) -> int:
    """The processes a stored run spec asks for (`num_devices`: its name in specs stored before the rename)."""
    return int(spec.get("num_processes", spec.get("num_devices", 1)) or 1)


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


class JobManager:
    """Submit, stop, resume and delete runs; start queued runs in worker processes (see the module docstring).

    Args:
        store: the studio database.
        data_dir: where run outputs (`runs/run-<id>`) and worker logs (`logs/run-<id>.log`) go.
        poll_interval: seconds between two scheduler passes.
        stale_after: seconds without heartbeat after which a worker counts as dead.
        watchdog_after: seconds without progress after which a live worker counts as hung (None: never).
        devices: the GPUs to schedule (default: detected).
        auto_resume: on start, queue interrupted runs again.
        launch_backoff: seconds to wait before each new start of a worker that died before claiming its run.
        claim_timeout: seconds a worker started here may take to claim its run before it is killed.
        worker_env: environment of the workers (default: this process's).
        run_minutes: limit of one run's work since its launch or last Resume: past it, it checkpoints and stops.
        chunk_seconds: work budget of one chunk of a chunked run.
        zerogpu: ZeroGPU mode (see the module docstring): every run is chunked, and pages, not the scheduler, run
            the chunks.
        pause_after: ZeroGPU mode: seconds without a page driving a queued run before it becomes "paused".
        ray: the Ray cluster that runs the workers (`app.runtime.ray_backend`); None: processes of this machine.
    """

    def __init__(self, store: Store, data_dir: str | os.PathLike[str], *, poll_interval: float = 1.0,
                 stale_after: float = STALE_AFTER, watchdog_after: float | None = WATCHDOG_AFTER,
                 devices: Devices | None = None, auto_resume: bool = True,
                 launch_backoff: Iterable[float] = LAUNCH_BACKOFF, claim_timeout: float = CLAIM_TIMEOUT,
                 worker_env: dict[str, str] | None = None, run_minutes: float | None = None,
                 chunk_seconds: float = DEFAULT_BUDGET, zerogpu: bool = False,
                 pause_after: float = PAUSE_AFTER, ray: RayCluster | None = None) -> None:
        self.store = store
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.folder = DataFolder(self.data_dir)
        self.poll_interval = poll_interval
        self.stale_after = stale_after
        self.watchdog_after = watchdog_after
        if ray is not None and zerogpu:
            raise ValueError("A ZeroGPU Space runs its chunks on the visitor's GPU calls: it cannot use a Ray cluster.")
        self.ray = ray
        self.devices = ray.devices() if ray is not None else devices if devices is not None else Devices.detect()
        self.auto_resume = auto_resume
        self.launch_backoff = tuple(launch_backoff)
        self.claim_timeout = claim_timeout
        self.worker_env = worker_env
        self.run_minutes = run_minutes
        self.chunk_seconds = float(chunk_seconds)
        self.zerogpu = zerogpu
        self.pause_after = pause_after
        # On a server, its advisory lock; on SQLite beside the file, on local disk (docs/spaces.md).
        self.lock = self.store.scheduler_lock(AlreadyServing)
        self._owner: dict[str, Any] | None = None  # who took the lock; None: not taken (`tick()` runs regardless)
        self.lock_problem: str | None = None  # why this studio schedules nothing now (its lock is lost), or None
        self.cluster_problem: str | None = None  # why the Ray cluster cannot be used now (it does not answer), or None
        self._lock = threading.RLock()
        self._procs: dict[int, Any] = {}  # run id -> worker (`subprocess.Popen`) or chunk (`ForkedChunk`) started here
        self._fingerprints: dict[int, str | None] = {}  # run id -> its V* set (`runspec.value_fingerprint_of`)
        self._launched_at: dict[int, float] = {}  # run id -> when its process in `_procs` was started
        self._devices: dict[int, list[str]] = {}  # run id -> devices given to a worker that has not claimed yet
        self._retry_at: dict[int, float] = {}  # run id -> earliest next start after a launch failure
        self._left_interrupted: set[int] = set()  # lost runs past `MAX_AUTO_RESUMES`, said once, left for a Resume
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self, **owner: Any) -> None:
        """Take the data folder's scheduler lock (`AlreadyServing` if another app has it), reconcile the runs
        table with the processes that exist, resume interrupted runs, then schedule in a background thread."""
        self.reconcile(schedule=True, **owner)

    def _start_scheduler(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._halt.clear()
            self._thread = threading.Thread(target=self._loop, name="a2po-scheduler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop scheduling and release the lock. Running workers keep running; a later `start()` adopts them."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._owner = self.lock_problem = None
        self.lock.release()

    def shutdown(self, grace: float = 25.0) -> list[int]:
        """Stop the deployment: no new starts, every worker asked to checkpoint and stop (its run ends
        "interrupted" and is resumed on the next start), then wait up to `grace` seconds for them to exit.
        Returns the runs that were asked to stop."""
        self._halt.set()
        stopping = []
        with self._lock:
            for run in self.store.list_runs(status=LIVE):
                pid = self._pid_of(run["id"], run)
                if pid is None:
                    continue
                self.store.apply(run["id"], lifecycle.REQUEST_STOP, stop_reason="shutdown")
                self.store.add_log(run["id"], "The studio is shutting down: checkpoint and stop; the run resumes "
                                              "when the studio starts again.")
                self._signal_stop(run, pid)
                stopping.append(run["id"])
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(self._worker_alive(i) for i in stopping):
            with self._lock:
                self._ingest_chunks()
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

    # ------------------------------------------------------------------ queue

    def submit(self, spec: dict[str, Any], owner: str | None = None, admission: Any = None) -> int:
        """Validate a run spec (see `a2po.runspec`) and queue it; returns the run id. Raises ValueError on a bad
        spec, and nothing is stored then."""
        from a2po.runspec import RunSpec

        if self.zerogpu:
            spec = {**spec, "runner": "chunked"}  # no process of this studio gets a GPU: only short GPU calls do
        run = RunSpec.from_dict(spec)
        clean = run.to_dict()
        if self.ray is not None:
            if run.runner == "chunked":
                raise ValueError("Chunked runs are forked from the studio's own process, and this studio sends its "
                                 "runs to a Ray cluster: use runner 'worker'.")
            self.devices = self.ray.devices()
            problem = self.ray.check(run.num_processes)
        else:
            problem = None
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
        """One scheduler pass: reap exited workers, apply running chunks' journals, supervise live runs, start what
        the devices allow (nothing while the scheduler lock is lost). Returns the ids of the runs started."""
        with self._lock:
            if not self._hold_lock():
                return []
            if self.ray is not None:
                self._refresh_cluster()
            self._reap()
            self._ingest_chunks()
            self._supervise()
            self._resume_lost()
            if self.zerogpu:
                self._pause_idle()
            return self._admit()

    def _hold_lock(self) -> bool:
        """Whether this studio still holds its scheduler lock, taking it back if it was lost (see the module
        docstring); says so in the log when that changes."""
        if self._owner is None or self.lock.check():
            return True
        try:
            self.lock.acquire(**self._owner)
        except AlreadyServing as error:
            problem = str(error)
        except Exception as error:  # noqa: BLE001 - the server is down or restarting: try again next pass
            problem = f"the database does not answer ({(str(error).strip().splitlines() or [repr(error)])[0][:300]})."
        else:
            logger.warning("The scheduler lock on the database was lost (a server restart?) and is taken back: "
                           "scheduling goes on." if self.lock_problem is None else
                           "The scheduler lock on the database is taken back: scheduling goes on.")
            self.lock_problem = None
            return True
        problem = f"This studio lost its lock on the database and starts no run until it takes it back: {problem}"
        if problem != self.lock_problem:
            logger.error("%s", problem)
        self.lock_problem = problem
        return False

    def active_run_ids(self) -> list[int]:
        """Runs with a live worker: started here, or running in the database with their worker alive."""
        with self._lock:
            ids = [rid for rid, proc in self._procs.items() if proc.poll() is None]
            ids += [r["id"] for r in self.store.list_runs(status=LIVE)
                    if r["id"] not in self._procs and self._worker_alive(r["id"], r)]
            return ids

    def _busy_devices(self) -> set[str]:
        busy = {d for devices in self._devices.values() for d in devices}
        for run in self.store.list_runs(status=LIVE):
            if run.get("devices") == "zerogpu":
                continue  # a GPU call of ZeroGPU's: none of this machine's devices
            if self._worker_alive(run["id"], run):
                busy.update((run.get("devices") or "*").split(","))
        return busy

    def _admit(self) -> list[int]:
        if self.cluster_problem is not None:
            return []  # queued runs wait for the cluster to answer: not launch failures
        started = []
        busy = self._busy_devices()
        queue = sorted(self.store.list_runs(status=lifecycle.QUEUED), key=lambda r: (r["queued_at"], r["id"]))
        sampling = self._stage_ones_under_way() if queue else set()
        for run in queue:
            if run["id"] in self._procs:  # started, not claimed yet (or still exiting after a stop and a resume)
                continue
            shared = self._fingerprint(run)
            if shared in sampling:
                # Another run is sampling the V* set this one uses (a sweep's points, a study's seeds): it starts
                # from the stored rows once that stage 1 is done, instead of sampling the same prompts beside it.
                continue
            if self.zerogpu and is_chunked(run):
                continue  # its page runs its chunks (`app.runtime.zerogpu`); it takes none of this machine's devices
            if self._retry_at.get(run["id"], 0.0) > time.time():
                break  # the head waits out its back-off; nothing overtakes it
            if run.get("started_at") and self._old_process(run):
                break  # an earlier process of the run is still exiting (adopted from an earlier studio)
            devices = self.devices.allocate(int(run.get("num_processes") or 1), busy)
            if devices is None:
                break
            if is_chunked(run):
                if not self._launch_chunk(run, devices):
                    continue
            else:
                self._launch(run["id"], devices, run.get("config") or {})
            busy.update(devices)
            started.append(run["id"])
            if shared is not None and not self._value_set_complete(shared):
                sampling.add(shared)
        return started

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
        with self._lock:
            started = list(self._procs)  # started here, perhaps not claimed yet (still queued)
        runs = self.store.list_runs(status=LIVE) + [r for r in map(self.store.get_run, started) if r is not None]
        prints = {self._fingerprint(r) for r in runs}
        return {p for p in prints if p is not None and not self._value_set_complete(p)}

    def _worker_env(self, devices: list[str]) -> dict[str, str]:
        env = with_project_path(self.worker_env if self.worker_env is not None else os.environ)
        env.pop("PGPASSWORD", None)  # the database password reaches the worker's store only (`worker_database`)
        # Credentials the studio passes on deliberately (the hub token when pushes are allowed): the worker strips
        # every other one it finds, such as those of a Ray node's own environment (`app.runtime.worker`).
        env[PASSED_SECRETS_ENV] = ",".join(sorted(k for k in env if SECRET_ENV.search(k)))
        if self.devices.gpus and self.ray is None:  # Ray sets CUDA_VISIBLE_DEVICES for the GPUs it gives a job
            env.update(self.devices.environment(devices))
        # A launcher asked to stop (SIGTERM) passes the signal on to its processes and kills them after this many
        # seconds: time for a step and a checkpoint. (The studio's own stops signal the processes directly.)
        env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(LAUNCHER_SHUTDOWN_TIMEOUT))
        return env

    def worker_database(self) -> str:
        """The database as a worker's command line names it: a server's URL without its password, which reaches
        the worker's own store connection only, through a file of the data folder (`keep_store_password`)."""
        if self.store.path is not None:
            return str(self.store.path)
        url, password = split_password(self.store.url)
        keep_store_password(self.data_dir, password)
        return url

    def worker_command(self, run_id: int, spec: dict[str, Any]) -> list[str]:
        """The command that runs a run: `python -m app.runtime.worker ...`, or for `num_processes` > 1 the same module
        under `accelerate launch` (DDP, or FSDP when the spec asks for it; gloo processes on a CPU-only machine),
        whose process is then the run's (its pid is the run's pid, see `app.runtime.worker`)."""
        worker = ["--db", self.worker_database(), "--run-id", str(run_id),
                  "--data-dir", str(self.data_dir)]
        processes = processes_of(spec)
        if processes <= 1:
            return [sys.executable, "-m", "app.runtime.worker", *worker]
        command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
                   "--num_machines", "1"]
        if spec.get("fsdp") and self.devices.gpus:
            # Untested here (no GPU). Full state dicts: checkpoints hold plain weights, as `checkpoint_complete`
            # and a resume with another process count expect.
            command += ["--use_fsdp", "--fsdp_sharding_strategy", str(spec["fsdp"]), "--fsdp_auto_wrap_policy",
                        "TRANSFORMER_BASED_WRAP", "--fsdp_state_dict_type", "FULL_STATE_DICT",
                        "--fsdp_use_orig_params", "true"]
        else:
            command += ["--multi_gpu"]  # without a GPU: gloo processes on the CPU
        # Every setting explicit, so an accelerate config file of the machine's user changes nothing; port 0: the
        # launcher picks a free port itself.
        return [*command, "--gpu_ids", "all", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "0", "--module", "app.runtime.worker", *worker]

    def _launch(self, run_id: int, devices: list[str], spec: dict[str, Any] | None = None) -> None:
        if self.ray is not None:
            self._launch_ray(run_id, devices, spec or {})
            return
        log_path = self.folder.run_log(run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.worker_command(run_id, spec or {})
        # An empty working directory: a hub id such as "org/name" must never name a local folder by accident.
        cwd = self.folder.make_worker_cwd()
        with open(log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._worker_env(devices), start_new_session=True, close_fds=True, cwd=cwd)
        self._procs[run_id] = proc
        self._launched_at[run_id] = time.time()
        self._devices[run_id] = devices
        self.store.update_run(run_id, devices=",".join(devices))
        processes = processes_of(spec or {})
        launcher = f"; accelerate launch of {processes} processes" if processes > 1 else ""
        self.store.add_log(run_id, f"Worker started (pid {proc.pid}, devices {','.join(devices)}{launcher}); its "
                                   f"output is in {log_path}.")

    def _launch_ray(self, run_id: int, devices: list[str], spec: dict[str, Any]) -> None:
        """Submit the run's worker as a Ray job (`app.runtime.ray_backend`); a job Ray refuses, or a cluster that
        cannot be reached, is a launch failure (retried after the back-off, then the run fails with the reason)."""
        command = self.worker_command(run_id, spec)
        cwd = self.folder.make_worker_cwd()
        gpus = processes_of(spec) if self.devices.gpus else 0
        self._launched_at[run_id] = time.time()
        env = {**self._worker_env(devices), TOKEN_ENV: self._data_folder_token()}
        try:
            job_id = self.ray.submit(run_id, command, env, str(cwd), gpus)
        except RayUnavailable as error:
            run = self.store.get_run(run_id)
            if run is not None:
                self._launch_failed(run, f"could not be submitted to the Ray cluster: {error}", output="")
            self._launched_at.pop(run_id, None)
            return
        self._procs[run_id] = RayJob(self.ray, job_id)
        self._devices[run_id] = devices
        self.store.update_run(run_id, devices=",".join(devices), ray_job_id=job_id)
        asked = f"{gpus} GPU(s)" if gpus else "1 CPU"
        # Every visitor reads a run's log: the cluster's address stays in the studio's own log.
        logger.info("Run %s: submitted to the Ray cluster at %s as job %s.", run_id, self.ray.address, job_id)
        self.store.add_log(run_id, f"Worker submitted to the Ray cluster as job {job_id} (asking for {asked}); its "
                                   "output is the job's log.")

    def _data_folder_token(self) -> str:
        return self.folder.token()

    def _refresh_cluster(self) -> None:
        """Read the cluster's devices; while it does not answer, keep the last known ones and say so once."""
        try:
            self.devices = self.ray.devices()
        except RayUnavailable as error:  # the next pass asks again
            if self.cluster_problem is None:
                logger.error("The Ray cluster does not answer: no run starts until it does (%s).", error)
            self.cluster_problem = str(error)
            return
        if self.cluster_problem is not None:
            logger.warning("The Ray cluster answers again: scheduling goes on.")
        self.cluster_problem = None

    def _on_ray(self, run: dict[str, Any]) -> bool:
        """Whether the run's worker is a Ray job that this studio watches."""
        return self.ray is not None and bool(run.get("ray_job_id")) and not is_chunked(run)

    def _foreign(self, run: dict[str, Any]) -> bool:
        """A run whose worker is a Ray job while this studio runs without `--ray-address`: it cannot tell whether the
        job lives, so it leaves the run alone (a studio with `--ray-address` adopts it)."""
        return self.ray is None and bool(run.get("ray_job_id")) and not is_chunked(run)

    def where(self, address: bool = False) -> dict[str, Any]:
        """Where runs go: this machine's devices, or the Ray cluster (for the API's /limits); the cluster's address
        only with `address` (an admin's: whoever reaches the Jobs API runs any code on the cluster)."""
        if self.ray is not None:
            where = self.ray.describe()
            return where if address else {k: v for k, v in where.items() if k != "address"}
        return {"backend": "zerogpu" if self.zerogpu else "local", "devices": self.devices.describe()}

    def worker_output(self, run_id: int, run: dict[str, Any] | None = None, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the run's worker output: its Ray job's log, or the worker's log file."""
        run = run if run is not None else self.store.get_run(run_id)
        if run is not None and self._on_ray(run):
            return self.ray.logs(run["ray_job_id"], lines)
        return tail(self.folder.run_log(run_id), lines)

    def public_text(self, text: str | None) -> str:
        """`text` as a visitor may read it: through the one scrubber (`storage.secrets.scrub_text`), which keeps
        paths inside this studio's data folder and hides the Ray cluster's address."""
        return scrub_text(text, self.data_dir, [self.ray.address] if self.ray is not None else ())

    def _launch_chunk(self, run: dict[str, Any], devices: list[str]) -> bool:
        """Claim a chunked run and start its next chunk in a freshly forked copy of this process (`app.runtime.chunks`).
        False when it could not be claimed (no longer queued, or a spec that fails at once: then it failed)."""
        run_id = run["id"]
        claimed = chunks.claim(self.store, self.data_dir, run, pid=os.getpid(), devices=",".join(devices))
        if claimed is None:
            return False
        log_path = self.folder.run_log(run_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} chunk {run['chunks_done'] + 1} of run {run_id} "
                      f"(forked, {self.chunk_seconds:g} s)\n".encode())
        pid = fork_chunk(self.data_dir, run_id, self.chunk_seconds, self._worker_env(devices), log_path)
        self._procs[run_id] = ForkedChunk(pid)
        self._launched_at[run_id] = time.time()
        self.store.update_run(run_id, pid=pid)
        self.store.add_log(run_id, f"Chunk {run['chunks_done'] + 1} started (forked process {pid}, devices "
                                   f"{','.join(devices)}, {self.chunk_seconds:g} s of work); its output is in "
                                   f"{log_path}.")
        return True

    def _old_process(self, run: dict[str, Any]) -> int | None:
        """A live process of an earlier start of the run that this studio did not start (it ended the run and has
        not exited yet): its worker by command line, or a chunk by its thread's name (`/proc`), working in this
        studio's folder for workers (another studio's run of the same id is not this one). On Ray: its job, still
        running."""
        if self._on_ray(run):
            return -1 if self.ray.active(run["ray_job_id"]) else None
        here = str(self.folder.worker_cwd)
        try:
            entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
        except OSError:
            return None
        for pid in entries:
            if pid == os.getpid() or not self._is_process_of(pid, run):
                continue
            try:
                if os.readlink(f"/proc/{pid}/cwd") == here and pid_alive(pid):
                    return pid
            except OSError:
                continue
        return None

    def _ingest_chunks(self) -> None:
        """Apply what running chunks wrote since the last pass (the pages show it as it happens; the heartbeat and
        progress times the supervision reads come with it)."""
        for run in self.store.list_runs(status=LIVE):
            if is_chunked(run) and not self._driven_here(run):
                try:
                    chunks.ingest(self.store, self.data_dir, run["id"])
                except Exception:  # noqa: BLE001 - a torn or busy write now is applied by the next pass
                    logger.exception("Applying the journal of run %s failed", run["id"])

    def _driven_here(self, run: dict[str, Any]) -> bool:
        """A ZeroGPU chunk driven by a page of this process (`app.runtime.zerogpu.ChunkDriver` follows and settles
        it)."""
        return run.get("pid") == os.getpid() and run["id"] not in self._procs

    def _pause_idle(self) -> None:
        """ZeroGPU mode: queued chunked runs that no page drove for `pause_after` seconds become "paused"."""
        now = time.time()
        for run in self.store.list_runs(status=lifecycle.QUEUED):
            last = max(run["queued_at"] or 0.0, run["heartbeat_at"] or 0.0)
            if is_chunked(run) and now - last > self.pause_after and self.store.apply(run["id"], lifecycle.PAUSE):
                self.store.add_log(run["id"], "Paused: no open page of the run drives its chunks. Open the run's "
                                              "page to go on.")

    # ------------------------------------------------------------------ supervision

    def _forget(self, run_id: int) -> None:
        self._procs.pop(run_id, None)
        self._launched_at.pop(run_id, None)
        self._devices.pop(run_id, None)

    def _reap(self) -> None:
        """Settle processes started here that exited. Each is forgotten only once its run's state is final."""
        for run_id, proc in list(self._procs.items()):
            code = proc.poll()
            if code is None:
                continue
            run = self.store.get_run(run_id)
            if isinstance(proc, ForkedChunk):
                if run is not None and run["status"] in LIVE and run["pid"] == proc.pid:
                    how = "exited" if code == 0 else f"exited with code {code}"
                    chunks.settle(self.store, self.data_dir, run_id, how, paused=self.zerogpu)
            elif isinstance(proc, RayJob):
                if run is not None and run.get("ray_job_id") == proc.job_id:
                    self._reap_ray(run, proc)
            elif run is not None and run["status"] == lifecycle.QUEUED and not self._claimed_since_launch(run):
                self._launch_failed(run, f"exited with code {code} before starting the run")
            elif run is not None and run["status"] in LIVE and run["pid"] == proc.pid:
                self._end(run_id, lifecycle.FAIL, f"Worker exited with code {code} without recording an end; last "
                                                  f"lines of its output:\n{tail(self.folder.run_log(run_id))}")
            self._forget(run_id)

    def _reap_ray(self, run: dict[str, Any], job: RayJob) -> None:
        """A Ray job that ended: as a local worker that exited, with Ray's word on how and the job's log."""
        how = self.ray.ending(job.job_id)
        if run["status"] == lifecycle.QUEUED and not self._claimed_since_launch(run):
            self._launch_failed(run, f"(Ray job {job.job_id}) ended {how} before starting the run",
                                output=self.worker_output(run["id"], run))
        elif run["status"] in LIVE:
            self._ray_job_gone(run, job.job_id, how)

    def _ray_job_gone(self, run: dict[str, Any], job_id: str, how: str) -> None:
        """A live run whose Ray job ended without the worker recording an end. Lost by the cluster (stopped from
        outside, forgotten by a restarted head, its node gone): interrupted and resumed. Ended by the worker itself
        (an exit code: a crash, a SIGKILL): failed, as a local worker that dies would."""
        if self.ray.lost(job_id):
            self._end(run["id"], lifecycle.INTERRUPT, f"The Ray cluster lost the worker: its job {job_id} ended {how}. "
                                                      "Interrupted; the studio resumes it from its latest checkpoint.",
                      stop_reason="lost")
            return
        self._end(run["id"], lifecycle.FAIL, f"The Ray job {job_id} of the worker ended {how} without recording an "
                                             f"end; last lines of its output:\n{self.worker_output(run['id'], run)}")

    def _resume_lost(self) -> None:
        """Queue again runs interrupted while a studio watched by something other than a shutdown (stop reason
        "lost": a stop from outside, a Ray cluster that lost the worker), as a restart resumes interrupted runs. A
        process of the run still exiting holds the next start back (`_admit`)."""
        if not self.auto_resume or self._halt.is_set():
            return
        waits = " once the Ray cluster answers" if self.cluster_problem else ""
        for run in self.store.list_runs(status=lifecycle.INTERRUPTED):
            if run.get("stop_reason") == "lost":
                self._auto_resume(run, f"Resumed automatically{waits} (from its latest checkpoint and stored V* "
                                       "values).")

    def _auto_resume(self, run: dict[str, Any], resumed: str) -> None:
        """Queue an interrupted run again at its old place (`auto_resume` keeps queued_at: ahead of the runs queued
        after it), at most `MAX_AUTO_RESUMES` times in a row without progress; past that, say so once and leave it
        for a Resume."""
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
            self._warn_reward_changes(run)

    def _claimed_since_launch(self, run: dict[str, Any]) -> bool:
        """Whether the run was claimed after its process in `_procs` started (that launch worked, whatever the run's
        status is now: stopped and queued again by a Resume while the process was still exiting, say)."""
        launched = self._launched_at.get(run["id"])
        return launched is not None and (run.get("started_at") or 0.0) >= launched

    def _launch_failed(self, run: dict[str, Any], what: str, output: str | None = None) -> None:
        failures = run["launch_failures"] + 1
        output = self.public_text(tail(self.folder.run_log(run["id"])) if output is None else output)
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
        """Fail runs whose worker is gone, silent (no heartbeat) or hung (no progress), and kill workers that never
        claim their run; see the module docstring."""
        now = time.time()
        for run_id, proc in list(self._procs.items()):
            if isinstance(proc, ForkedChunk) or proc.poll() is not None:
                continue
            run = self.store.get_run(run_id)
            if (run is not None and run["status"] == lifecycle.QUEUED and not self._claimed_since_launch(run)
                    and now - self._launched_at.get(run_id, now) > self.claim_timeout):
                self._kill_worker(run_id, run)
                self._launch_failed(run, f"did not claim the run within {self.claim_timeout:.0f} s of its start "
                                         "(killed)")
                self._forget(run_id)
        for run in self.store.list_runs(status=LIVE):
            run_id = run["id"]
            proc = self._procs.get(run_id)
            if proc is not None and proc.poll() is not None:
                continue  # exited just now: `_reap` settles it on the next pass
            if self._driven_here(run):
                continue  # a ZeroGPU call of this process's: its page settles it (the call's duration bounds it)
            if self._foreign(run):
                continue
            if not self._worker_alive(run_id, run) and self._on_ray(run):
                self._ray_job_gone(run, run["ray_job_id"], self.ray.ending(run["ray_job_id"]))
                continue
            if not self._worker_alive(run_id, run):
                if is_chunked(run):
                    chunks.settle(self.store, self.data_dir, run_id, f"(pid {run['pid']}) is gone", paused=self.zerogpu)
                    continue
                self._end(run_id, lifecycle.FAIL, f"Worker died: process {run['pid']} is gone (killed, for example out "
                                                  "of memory, or crashed); last lines of its output:\n"
                                                  f"{tail(self.folder.run_log(run_id))}")
                continue
            beat = run["heartbeat_at"] or run["started_at"] or now
            progress = run["progress_at"] or run["started_at"] or now
            worked = (run["limit_seconds"] or 0.0) + now - (run["started_at"] or now)
            if now - beat > self.stale_after and self._on_ray(run) and self.cluster_problem is not None:
                # Its job cannot be asked about or stopped: the head is down, and the worker most likely with it.
                # `_admit` starts the run again only once the cluster answers and no job of it runs any more.
                self._end(run_id, lifecycle.INTERRUPT, f"The Ray cluster does not answer and the worker's heartbeat "
                                                       f"stopped {now - beat:.0f} s ago: interrupted; the studio "
                                                       "resumes it once the cluster answers.", stop_reason="lost")
            elif now - beat > self.stale_after:
                self._kill_worker(run_id, run)
                self._lost(run, f"no heartbeat for {now - beat:.0f} s (pid {run['pid']} killed)")
            elif self.run_minutes is not None and run["status"] == lifecycle.RUNNING and worked > self.run_minutes * 60:
                self.store.add_log(run_id, f"The studio's limit of {self.run_minutes:g} minutes per run is reached: "
                                           "checkpoint and stop (Resume continues it).", level="WARNING")
                self.stop(run_id, reason="limit")
            elif self.watchdog_after is not None and now - progress > self.watchdog_after:
                self._kill_worker(run_id, run)
                logs = "\n".join(f"{x['level']} {x['message']}" for x in self._last_logs(run_id))
                self._end(run_id, lifecycle.FAIL, f"Watchdog: the worker (pid {run['pid']}) was alive but made no "
                                                  f"progress for {now - progress:.0f} s (no stage-1 batch, training "
                                                  "step, evaluation or checkpoint; limit "
                                                  f"{self.watchdog_after:.0f} s), so it was killed. Its last log "
                                                  f"lines:\n{logs}", stop_reason="watchdog")

    def _lost(self, run: dict[str, Any], how: str) -> None:
        """A run's process was killed by the supervision: a chunk is settled as a lost chunk, a worker fails."""
        if is_chunked(run):
            chunks.settle(self.store, self.data_dir, run["id"], how, paused=self.zerogpu)
            self._forget(run["id"])
        else:
            self._end(run["id"], lifecycle.FAIL, f"Worker died: {how}.")

    def _last_logs(self, run_id: int) -> list[dict[str, Any]]:
        last = self.store.last_ids(run_id)["logs"]
        return self.store.get_logs(run_id, after_id=max(0, last - LOG_TAIL_LINES))

    def _end(self, run_id: int, event: lifecycle.Event, message: str, **fields: Any) -> bool:
        """End a live run by `event` with `message` as its error (ERROR log line too); a chunk's journal is
        applied first, so what it wrote is kept."""
        run = self.store.get_run(run_id)
        if run is not None and is_chunked(run):
            chunks.ingest(self.store, self.data_dir, run_id)
        message = self.public_text(message)  # a dead worker's log tail: its command line names the database
        if self.store.apply(run_id, event, error=message, **fields):
            self.store.add_log(run_id, message, level="ERROR" if event is lifecycle.FAIL else "WARNING")
            journal.clear(self.data_dir, run_id)
            self.store.reset_journal(run_id)
            self._forget(run_id)
            return True
        return False

    def reconcile(self, schedule: bool = True, **owner: Any) -> list[int]:
        """Take the scheduler lock and check every live run against its process, as at app start: a live worker
        is adopted (it goes on; supervision covers it); a run whose worker is gone was interrupted while no studio
        watched it (a chunk's journal says how far it got, or how it ended). Interrupted runs are queued again (with
        `auto_resume`), files of deleted runs removed. With `schedule`, start the scheduler thread. Returns the
        runs found interrupted."""
        self.lock.acquire(**owner)
        self._owner, self.lock_problem = owner, None
        interrupted = []
        now = time.time()
        with self._lock:
            self._reap()
            for run in self.store.list_runs(status=LIVE):
                run_id = run["id"]
                if run_id in self._procs or self._driven_here(run) or self._worker_alive(run_id, run):
                    continue
                if self._foreign(run):
                    logger.warning("Run %s runs as Ray job %s: start the studio with --ray-address to watch it.",
                                   run_id, run["ray_job_id"])
                    continue
                if is_chunked(run):
                    outcome = chunks.settle(self.store, self.data_dir, run_id, "was gone when the studio started",
                                            paused=self.zerogpu)
                    if outcome == "lost" and self.store.get_run(run_id)["status"] == lifecycle.QUEUED:
                        interrupted.append(run_id)
                    continue
                user_stop = run["status"] == lifecycle.STOPPING and run.get("stop_reason") in (None, "user")
                message = ("The worker was gone when the studio started (the machine or container was stopped, "
                           f"or the worker was killed while no studio was running; pid {run['pid']}).")
                if self._on_ray(run):
                    message = (f"The worker's Ray job {run['ray_job_id']} ended while no studio was watching: "
                               f"{self.ray.ending(run['ray_job_id'])}.")
                event = lifecycle.STOP if user_stop else lifecycle.INTERRUPT
                if self.store.apply(run_id, event, error=None if user_stop else message,
                                    stop_reason="user" if user_stop else "shutdown", finished_at=now):
                    self.store.add_log(run_id, message, level="WARNING")
                    interrupted.append(run_id)
            if self.auto_resume:
                self._resume_interrupted()
            self._remove_orphan_files()
        if schedule:
            self._start_scheduler()
        return interrupted

    def _resume_interrupted(self) -> None:
        for run in self.store.list_runs(status=lifecycle.INTERRUPTED):
            self._auto_resume(run, "Resumed automatically after the interruption (from its latest checkpoint and "
                                   "stored V* values).")

    def _remove_orphan_files(self) -> None:
        """Outputs, logs, journals and exports of runs that no longer exist (deleted while files were busy, or by an
        older studio that left them behind): a run's files go with it. And the checkpoints of finished runs (a kill
        between recording the end and removing them)."""
        self.folder.remove_orphans({r["id"] for r in self.store.list_runs()})
        for run in self.store.list_runs(status=lifecycle.FINISHED):
            remove_checkpoints(self.store, run["id"])

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
            pid = self._pid_of(run_id, run)
            if pid is None and not self._driven_here(run):  # nobody left to stop: record it now
                if is_chunked(run):
                    self.store.apply(run_id, lifecycle.REQUEST_STOP, stop_reason=reason)
                    chunks.settle(self.store, self.data_dir, run_id, "was already gone", paused=self.zerogpu)
                else:
                    self._end(run_id, lifecycle.STOP, "Stopped; its worker was already gone.", stop_reason=reason)
                return True
            self.store.apply(run_id, lifecycle.REQUEST_STOP, stop_reason=reason)
            self.store.add_log(run_id, "Stop requested.")
            self._signal_stop(run, pid)
            return True

    def resume(self, run_id: int) -> int:
        """Queue a stopped, interrupted or failed run again; it continues from its latest checkpoint and stored V*
        values. Returns the run id. Raises ValueError when the run cannot be resumed."""
        run = self.store.get_run(run_id)
        if run is None:
            raise ValueError(f"Run {run_id} does not exist (it may have been deleted).")
        if not self.store.apply(run_id, lifecycle.RESUME):
            raise ValueError(f"Run {run_id} is {run['status']}: only stopped, interrupted or failed runs can be "
                             "resumed (and paused chunked runs); submit a new run to train again.")
        self._retry_at.pop(run_id, None)
        self.store.add_log(run_id, "Queued again to resume.")
        self._warn_reward_changes(run)
        return run_id

    def _warn_reward_changes(self, run: dict[str, Any]) -> list[str]:
        """Log a warning for each registered reward of the run that changed (or went) since its spec recorded it:
        the resumed run scores with what is registered now. Reads the files; imports nothing."""
        from a2po.reward_registry import reward_changes

        try:
            warnings = reward_changes((run.get("config") or {}).get("rewards"), what="the resumed run")
        except Exception as error:  # noqa: BLE001 - a warning that cannot be computed must not block a resume
            warnings = [f"Could not check whether the run's registered rewards changed: {error}"]
        for warning in warnings:
            self.store.add_log(run["id"], warning, level="WARNING")
        return warnings

    def delete(self, run_id: int, kill_timeout: float = 10.0) -> bool:
        """Delete a run: kill its worker if it runs (a chunk of ZeroGPU's is asked to stop instead), remove its
        rows, log, journal, exports and output directory (the shared value set stays). Returns False if the run did
        not exist."""
        self._fingerprints.pop(int(run_id), None)  # an id SQLite may give again to a new run
        with self._lock:
            run = self.store.get_run(run_id)
            if run is None:
                return False
            if is_chunked(run):
                journal.request_stop(self.data_dir, run_id)
            if self._pid_of(run_id, run):
                self._kill_worker(run_id, run, timeout=kill_timeout)  # no checkpoint needed, no write after
            in_flight = self._driven_here(run) and run["status"] in LIVE
            self._forget(run_id)
            self._retry_at.pop(run_id, None)
            self.store.delete_run(run_id)
        self.folder.remove_run(run_id, run["output_dir"], keep_journal=in_flight)
        return True

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _is_process_of(pid: int, run: dict[str, Any]) -> bool:
        """Is `pid` the run's worker, or (a chunked run) a process running one of its chunks?"""
        return is_chunk_of(pid, run["id"]) if is_chunked(run) else is_worker_of(pid, run["id"])

    def _worker_alive(self, run_id: int, run: dict[str, Any] | None = None) -> bool:
        proc = self._procs.get(run_id)
        if proc is not None:
            return proc.poll() is None
        run = run if run is not None else self.store.get_run(run_id)
        if run is not None and self._on_ray(run):
            return self.ray.active(run["ray_job_id"])
        return bool(run and pid_alive(run["pid"]) and self._is_process_of(run["pid"], run))

    def _pid_of(self, run_id: int, run: dict[str, Any]) -> int | None:
        """The pid of the run's process if this studio may signal it: its worker, or a chunk it forked (started
        here or by an earlier studio); never this process itself (a ZeroGPU call's page)."""
        proc = self._procs.get(run_id)
        if isinstance(proc, RayJob) or (proc is None and self._on_ray(run)):
            # The job is signalled through Ray, never by pid: -1 stands for "alive, on some node".
            return -1 if self._worker_alive(run_id, run) else None
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        pid = run.get("pid")
        if not pid or pid == os.getpid():
            return None
        return pid if pid_alive(pid) and self._is_process_of(pid, run) else None

    def _signal_stop(self, run: dict[str, Any], pid: int | None) -> None:
        """Ask a run's process to stop: SIGTERM to a worker or a forked chunk, and a chunk's stop file (which a
        ZeroGPU chunk, never signalled, reads as the run's "stopping")."""
        if is_chunked(run):
            journal.request_stop(self.data_dir, run["id"])
        if self._on_ray(run):
            self.ray.stop(run["ray_job_id"])
        elif pid is not None:
            self._kill(pid, signal.SIGTERM)

    def _kill_worker(self, run_id: int, run: dict[str, Any], timeout: float = 10.0) -> None:
        """SIGKILL the worker (and its process group) and wait until it is gone, so it cannot write afterwards."""
        pid = self._pid_of(run_id, run)
        if pid is None:
            return
        if self._on_ray(run):  # Ray has no kill: a stop, whose SIGKILL comes after the grace, and a wait for it
            self.ray.stop(run["ray_job_id"])
            deadline = time.monotonic() + timeout
            while self.ray.active(run["ray_job_id"]) and time.monotonic() < deadline:
                time.sleep(0.2)
            return
        processes = launched_processes(pid)
        self._kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while (pid_alive(pid) or any(map(pid_alive, processes))) and time.monotonic() < deadline:
            proc = self._procs.get(run_id)
            if proc is not None:
                proc.poll()
            time.sleep(0.05)

    @staticmethod
    def _kill(pid: int, sig: int) -> None:
        """Signal the worker; SIGKILL goes to its whole process group (its own session, see `_launch`).

        A launcher of several processes (`accelerate launch`) would pass a SIGTERM on to them, then kill them after
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds and exit with an error: a stop goes to its processes directly (each
        asks for the stop; the trainer makes them agree), and a SIGKILL to their process groups as well (each
        process has a session of its own; they also die with the launcher, see `app.runtime.worker.die_with_parent`)."""
        processes = launched_processes(pid)
        targets = processes if sig == signal.SIGTERM and processes else [pid]
        if sig == signal.SIGKILL:
            targets = [pid, *processes]
        for target in targets:
            if target == os.getpid():
                continue
            try:
                if sig == signal.SIGKILL and os.getpgid(target) == target:
                    os.killpg(target, sig)
                else:
                    os.kill(target, sig)
            except ProcessLookupError:
                pass
