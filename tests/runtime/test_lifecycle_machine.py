"""The run state machine against the real thing: hypothesis drives the real scheduler
(`app.runtime.scheduler.Scheduler`), a real SQLite file and real worker and chunk processes of a tiny model through
launches, stops, resumes, kills of workers and of chunks, app restarts and deletes, and checks after every step what
`storage.lifecycle` promises:

- no run with two live processes, and every live run's process exists (or is settled within a few passes);
- the counters as documented (bounded restarts and launch failures, reset by a user's Resume; pids only on runs
  a process works on; statuses and stop reasons from the machine's lists);
- nothing committed is lost: a run's stored V* rows, metric rows and evaluations never disappear while it exists;
- at the end, with no more interference, every run that is resumed reaches its end, none stuck.

Profiles: CI (`A2PO_MACHINE_EXAMPLES`, default 3 examples of up to 8 steps after launching a worker run and a
chunked run, no shrinking); `make stress` runs 10 examples of up to 25 steps with shrinking.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.runtime.chunks import is_chunk_of
from app.runtime.devices import Devices
from app.runtime.processes import pid_alive
from app.runtime.scheduler import Scheduler
from storage import Store, lifecycle

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
EXAMPLES = int(os.environ.get("A2PO_MACHINE_EXAMPLES", "3"))
STEPS = int(os.environ.get("A2PO_MACHINE_STEPS", "8" if EXAMPLES <= 3 else "25"))
MAX_RUNS = 3
LAUNCH_BACKOFF = (0.2, 0.5)


def tiny_spec(model: str, runner: str, name: str) -> dict:
    settings_ = {"num_value_samples": 2, "max_completion_length": 4, "max_steps": 6, "per_device_train_batch_size": 4,
                 "value_batch_size": 4, "use_cpu": True, "logging_steps": 1, "gradient_checkpointing": False,
                 "seed": 0, "save_steps": 2, "learning_rate": 1e-3, "filter_all_incorrect": False}
    return {"name": name, "action": "train", "model": model, "runner": runner,
            "dataset": {"source": "arithmetic", "num_prompts": 8, "difficulty": 1, "operations": "+", "seed": 0,
                        "eval_size": 0},
            "rewards": [{"name": "exact_match", "weight": 1.0}], "config": settings_}


def processes_of(run_id: int, data: Path) -> list[int]:
    """Live processes working on the run: its worker (`app.runtime.worker ... --run-id N`) or a chunk of it (a thread
    named `a2po-c<N>`), in the studio's folder of workers `data` (not another test session's), found in /proc."""
    here, found = str(data / "cache" / "worker-cwd"), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        worker = "app.runtime.worker" in argv and "--run-id" in argv and argv[argv.index("--run-id") + 1] == str(run_id)
        try:
            ours = os.readlink(f"/proc/{pid}/cwd") == here
        except OSError:
            continue
        if ours and (worker or is_chunk_of(pid, run_id)) and pid_alive(pid):
            found.append(pid)
    return found


class RunMachine(RuleBasedStateMachine):
    model_dir: str = ""
    root: Path = Path()

    @initialize()
    def start(self) -> None:
        RunMachine.example = getattr(RunMachine, "example", 0) + 1
        self.data = RunMachine.root / f"example-{RunMachine.example}"
        self.store = Store(self.data / "studio.db")
        self.manager = self._manager()
        self.manager.start()
        self.runs: dict[int, str] = {}  # run id -> runner
        self.seen: dict[int, dict[str, int]] = {}  # run id -> what was committed at least (rows)
        for runner in ("worker", "chunked"):  # every example has work of both kinds under way
            self.launch(runner)

    def _manager(self) -> Scheduler:
        return Scheduler(self.store, self.data, poll_interval=0.1, devices=Devices(), stale_after=30,
                          launch_backoff=LAUNCH_BACKOFF, claim_timeout=60, chunk_seconds=0.5,
                          worker_env=dict(os.environ, A2PO_FAULTS=""))

    def teardown(self) -> None:
        try:
            self.manager.close()
            self._finish_all()
        finally:
            for run_id in list(self.runs):
                for pid in processes_of(run_id, self.data):
                    os.kill(pid, signal.SIGKILL)
            self.manager.close()
            self.store.close()

    def _finish_all(self) -> None:
        """No more interference: resume what can be resumed, and every run ends, none stuck."""
        self.manager = self._manager()
        self.manager.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            runs = [self.store.get_run(i) for i in self.runs]
            for run in runs:
                if run and run["status"] in (lifecycle.STOPPED, lifecycle.FAILED, lifecycle.INTERRUPTED):
                    self.manager.resume(run["id"])
            runs = [self.store.get_run(i) for i in self.runs]
            if all(r is None or r["status"] == lifecycle.FINISHED for r in runs):
                break
            time.sleep(0.5)
            self.check_committed()
        else:
            stuck = {i: (r["status"], r["error"]) for i in self.runs if (r := self.store.get_run(i))
                     and r["status"] != lifecycle.FINISHED}
            raise AssertionError(f"runs did not finish: {stuck}")
        self.manager.close()

    # ------------------------------------------------------------------ rules

    def live_runs(self) -> list[dict]:
        return [r for r in (self.store.get_run(i) for i in self.runs) if r and r["status"] in lifecycle.LIVE]

    @precondition(lambda self: len(self.runs) < MAX_RUNS)
    @rule(runner=st.sampled_from(["worker", "chunked"]))
    def launch(self, runner: str) -> None:
        run_id = self.manager.submit(tiny_spec(RunMachine.model_dir, runner, f"{runner}-{len(self.runs)}"))
        self.runs[run_id] = runner

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def stop(self, data) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        before = self.store.get_run(run_id)["status"]
        stopped = self.manager.stop(run_id)
        after = self.store.get_run(run_id)["status"]
        if before in lifecycle.ENDED:
            assert not stopped and after == before
        elif stopped and before in lifecycle.WAITING:
            assert after == lifecycle.STOPPED
        elif stopped:
            assert after in (lifecycle.STOPPING, *lifecycle.ENDED, *lifecycle.WAITING)

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def resume(self, data) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        status = self.store.get_run(run_id)["status"]
        try:
            self.manager.resume(run_id)
        except ValueError:
            assert status not in lifecycle.RESUMABLE
            return
        run = self.store.get_run(run_id)
        assert status in lifecycle.RESUMABLE and run["status"] == lifecycle.QUEUED
        assert run["auto_resumes"] == run["launch_failures"] == 0 and run["limit_seconds"] == 0

    # Preconditions and draws read only the model (`self.runs`), never the processes: hypothesis replays a prefix of
    # choices and must meet the same rules again, while which processes are alive depends on timing.
    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def kill_process(self, data) -> None:
        """SIGKILL a run's worker or chunk process (whichever it has now; none: nothing happens)."""
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        for pid in processes_of(run_id, self.data):
            os.kill(pid, signal.SIGKILL)

    @rule()
    def restart_app(self) -> None:
        self.manager.close()
        self.manager = self._manager()
        self.manager.start()

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def delete(self, data) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.runs)))
        assert self.manager.delete(run_id)
        del self.runs[run_id]
        self.seen.pop(run_id, None)
        assert self.store.get_run(run_id) is None
        assert not processes_of(run_id, self.data)

    @rule(seconds=st.sampled_from([0.5, 2.0, 5.0]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def one_process_per_run(self) -> None:
        if not hasattr(self, "runs"):
            return
        for run_id in self.runs:
            assert len(processes_of(run_id, self.data)) <= 1, (run_id, processes_of(run_id, self.data))

    @invariant()
    def counters_as_documented(self) -> None:
        if not hasattr(self, "runs"):
            return
        for run_id in self.runs:
            run = self.store.get_run(run_id)
            assert run["status"] in lifecycle.STATUSES
            assert run["stop_reason"] in (None, *lifecycle.STOP_REASONS)
            assert 0 <= run["auto_resumes"] <= lifecycle.MAX_AUTO_RESUMES + 1
            assert 0 <= run["launch_failures"] <= len(LAUNCH_BACKOFF) + 1
            assert run["limit_seconds"] >= 0 and run["chunk_seconds"] >= 0 and run["chunks_done"] >= 0
            if run["status"] in lifecycle.LIVE:
                assert run["pid"], run
            else:
                assert run["pid"] is None, run
            if self.runs[run_id] == "worker":
                assert run["chunks_done"] == 0

    @invariant()
    def live_runs_have_processes(self) -> None:
        """A live run whose process is gone is settled within a few scheduler passes."""
        if not hasattr(self, "runs"):
            return
        for run in self.live_runs():
            if processes_of(run["id"], self.data):
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                now = self.store.get_run(run["id"])
                if now is None or now["status"] not in lifecycle.LIVE or now["pid"] != run["pid"] \
                        or processes_of(run["id"], self.data):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"run {run['id']} stays {run['status']} with no process")

    @invariant()
    def check_committed(self) -> None:
        """What a run committed stays: its V* rows, metric rows and evaluations never go away while it exists."""
        if not hasattr(self, "runs"):
            return
        for run_id in self.runs:
            run = self.store.get_run(run_id)
            now = {"values": self.store.count_values(run["value_set_id"], None) if run["value_set_id"] else 0,
                   "metrics": len(self.store.get_metrics(run_id)),
                   "evaluations": len(self.store.get_evaluations(run_id))}
            before = self.seen.get(run_id, {})
            for key, count in now.items():
                assert count >= before.get(key, 0), (run_id, key, before, now)
            self.seen[run_id] = now


def test_run_state_machine_holds_against_real_processes(tmp_path, tiny_model_dir):
    RunMachine.model_dir, RunMachine.root = tiny_model_dir, tmp_path
    long = EXAMPLES > 3
    run_state_machine_as_test(RunMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=not long,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if long else [])],
        suppress_health_check=list(HealthCheck), database=None))
