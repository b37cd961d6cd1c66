"""The `Launcher` protocol and what every launcher shares: the workers' environment and command (docs/runtime.md)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.access.policy import SECRET_ENV
from app.runtime.credentials import PASSED_SECRETS_ENV
from app.runtime.data_folder import LOG_TAIL_LINES, DataFolder
from app.runtime.devices import Devices
from app.runtime.processes import with_project_path
from storage import Store

EXITED, LOST, FAILED = "exited", "lost", "failed"  # the kinds of `Ending`
LAUNCHER_SHUTDOWN_TIMEOUT = 120  # seconds an `accelerate launch` asked to stop gives its processes to checkpoint


@dataclass(frozen=True)
class Ending:
    """How a run's process ended without recording the run's end. `kind`: EXITED (it exited by itself) or FAILED
    (it died, or is gone): the run fails; LOST (its backend lost it): the run is interrupted and resumed. `how`:
    what happened to the process, in a few words (a launch failure's reason); `message`: the run's error."""

    kind: str
    how: str
    message: str


class LaunchFailed(RuntimeError):
    """The backend refused to start the run's process (a launch failure: retried after the back-off)."""


class Launcher:
    """The protocol every backend implements, with the defaults of a launcher whose processes write the database
    themselves. Methods take the run's row; a launcher keeps what it started itself, by run id."""

    starts_runs = True  # False: something else starts its runs (a page's GPU call), never the scheduler
    settles_runs = False  # True: its processes never write the database; `settle` records how they ended
    pins_gpus = True  # the workers' environment names their GPUs (False: the backend does it)
    # The clocks a launcher waits and judges by (tests give it fake ones).
    monotonic = staticmethod(time.monotonic)
    now = staticmethod(time.time)
    sleep = staticmethod(time.sleep)

    def __init__(self, store: Store, folder: DataFolder) -> None:
        self.store = store
        self.folder = folder

    def start(self, run: dict[str, Any], devices: list[str], env: dict[str, str]) -> bool:
        """Start the run's process; False when the run could not be started and is left as it is now. Raises
        `LaunchFailed` when the backend refused."""
        raise NotImplementedError

    def alive(self, run: dict[str, Any]) -> bool:
        """Whether the run's process lives: the one started here, or the one an earlier studio started."""
        raise NotImplementedError

    def ending(self, run: dict[str, Any]) -> Ending | None:
        """How the run's process ended; None while it lives."""
        raise NotImplementedError

    def ask_to_stop(self, run: dict[str, Any]) -> None:
        """Ask the run's process to checkpoint and stop."""
        raise NotImplementedError

    def kill(self, run: dict[str, Any], timeout: float = 10.0) -> None:
        """End the run's process now and wait until it is gone, so it cannot write afterwards."""
        raise NotImplementedError

    def output(self, run: dict[str, Any], lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the run's process output."""
        return self.folder.log_tail(run["id"], lines)

    def forget(self, run_id: int) -> None:
        """Drop what was kept about the process started for the run (it ended, or the run is gone)."""

    def describe(self, run: dict[str, Any]) -> str:
        """The run's process, in words."""
        return f"pid {run['pid']}"

    def gone_unwatched(self, run: dict[str, Any]) -> str:
        """The run's error when its process was gone as the studio started."""
        return ("The worker was gone when the studio started (the machine or container was stopped, or the worker "
                f"was killed while no studio was running; pid {run['pid']}).")

    def lingering(self, run: dict[str, Any]) -> bool:
        """Whether a process of an earlier start of the run, not started here, is still exiting."""
        return False

    def followed_elsewhere(self, run: dict[str, Any]) -> str | None:
        """Who follows the run's process instead of the scheduler (it neither supervises nor settles it), or None."""
        return None

    def follow(self, run: dict[str, Any]) -> None:
        """Apply what the run's process wrote since the last pass (a launcher whose processes keep a journal)."""

    def settle(self, run: dict[str, Any], how: str) -> str:
        """With `settles_runs`: record how the run's gone process ended (`how`: what happened to it); returns the
        outcome."""
        raise NotImplementedError

    def out_of_reach(self, run: dict[str, Any], silent_for: float) -> str | None:
        """The run's error when its process cannot be asked about or stopped now and its heartbeat stopped
        `silent_for` seconds ago (it is interrupted, not killed), or None."""
        return None

    def each_pass(self) -> str | None:
        """Work of every scheduler pass; returns why no run may start now, or None."""
        return None


def worker_environment(base: Mapping[str, str], devices: Devices, given: list[str], pin_gpus: bool) -> dict[str, str]:
    """The environment of a worker (or a forked chunk) given `given` of `devices`."""
    env = with_project_path(base)
    env.pop("PGPASSWORD", None)  # the database password reaches the worker's store only (`worker_database`)
    # Credentials the studio passes on deliberately (the hub token when pushes are allowed): the worker strips
    # every other one it finds, such as those of a Ray node's own environment (`app.runtime.credentials`).
    env[PASSED_SECRETS_ENV] = ",".join(sorted(k for k in env if SECRET_ENV.search(k)))
    if devices.gpus and pin_gpus:
        env.update(devices.environment(given))
    # A launcher asked to stop (SIGTERM) passes the signal on to its processes and kills them after this many
    # seconds: time for a step and a checkpoint. (The studio's own stops signal the processes directly.)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(LAUNCHER_SHUTDOWN_TIMEOUT))
    return env


def exit_text(code: int) -> str:
    """How a process ended, from its exit code: a negative code is the signal that killed it, named, and SIGKILL
    with its most common sender (the worker never sends it; a user's `kill -9` or the out-of-memory killer does)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "an unknown signal"
    text = f"was killed by signal {-code} ({name}; exit code {code})"
    if -code == signal.SIGKILL:
        text += (", which on Linux is most often the kernel's out-of-memory killer: `dmesg` names the process it "
                 "killed; a smaller per_device_train_batch_size or fewer runs at once on the machine needs less memory")
    return text


def processes_of(spec: dict[str, Any]) -> int:
    """The processes a stored run spec asks for (`num_devices`: its name in specs stored before the rename)."""
    return int(spec.get("num_processes", spec.get("num_devices", 1)) or 1)


def worker_command(database: str, folder: DataFolder, gpus: bool, run_id: int, spec: dict[str, Any]) -> list[str]:
    """The command that runs a run: `python -m app.runtime.worker ...`, or for `num_processes` > 1 the same module
    under `accelerate launch` (DDP, or FSDP when the spec asks for it; gloo processes on a CPU-only machine), whose
    process is then the run's (its pid is the run's pid, see `app.runtime.worker`)."""
    worker = ["--db", database, "--run-id", str(run_id), "--data-dir", str(folder.root)]
    processes = processes_of(spec)
    if processes <= 1:
        return [sys.executable, "-m", "app.runtime.worker", *worker]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
               "--num_machines", "1"]
    if spec.get("fsdp") and gpus:
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


