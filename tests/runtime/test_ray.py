"""The Ray backend on a real one-node Ray cluster (`ray_cluster`) with the store on PostgreSQL (`postgres_server`),
through the named API of an app started with `--ray-address`: a run equals the same run of a local worker on
SQLite, and a stop, a resume, a worker killed with SIGKILL and an app killed and started again behave as they do
with local workers (`tests/runtime/test_durability.py`)."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest
from gradio_client import Client

from storage import Store
from tests import helpers
from tests.runtime.test_durability import MAX_STEPS, assert_same_run, durable_spec, record
from tests.web.test_app_api import free_port, start_app, stop_app

# Only this file starts (and stops) the one-node Ray head, so `--dist loadfile` keeps it on one pytest process.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
wait_for = functools.partial(helpers.wait_for, poll=0.1)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir) -> dict:
    """The run through /launch of an app with local workers and SQLite (the defaults)."""
    data_dir = tmp_path_factory.mktemp("local")
    port = free_port()
    app = start_app(data_dir, port, "--model-root", tiny_model_dir)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        assert client.predict(api_name="/limits")["runs_go_to"]["backend"] == "local"
        run_id = client.predict(spec=durable_spec(tiny_model_dir, "local"), api_name="/launch")["run_id"]
        store = Store(data_dir / "studio.db")
        run = helpers.wait_status(store, run_id, ("finished", "failed"), 180)
        assert run["status"] == "finished", run["error"]
        return record(store, run_id)
    finally:
        stop_app(app)


def ray_app(data_dir, db: str, model_root: str, faults: str = ""):
    """`python -m app --ray-address ... --db <PostgreSQL>` (the tiny model's folder is a model root of it)."""
    port = free_port()
    proc = start_app(data_dir, port, "--ray-address", "http://127.0.0.1:8265", "--db", db, "--shutdown-grace", "20",
                     "--model-root", model_root, env={"A2PO_FAULTS": faults})
    return proc, Client(f"http://127.0.0.1:{port}/", verbose=False)


def worker_pid(run_id: int, data_dir: Path) -> int | None:
    """The worker process of the run, wherever Ray started it on this machine: by its command line, which names the
    run id and the studio's data folder (another test's worker may carry the same run id: never this one's to kill)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        pairs = list(zip(argv, argv[1:]))
        if ("app.runtime.worker" in argv and ("--run-id", str(run_id)) in pairs
                and any(a == "--data-dir" and Path(b).resolve() == data_dir.resolve() for a, b in pairs)):
            return int(entry)
    return None


def job_status(job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient("http://127.0.0.1:8265").get_job_status(job_id).value


def test_a_ray_run_equals_a_local_run(ray_cluster, postgres_server, tmp_path, tiny_model_dir, reference):
    db = postgres_server.create_database()
    app, client = ray_app(tmp_path / "studio", db, tiny_model_dir)
    try:
        where = client.predict(api_name="/limits")["runs_go_to"]
        assert where["backend"] == "ray" and "address" not in where  # the operator's alone (docs/security.md)
        assert "Ray cluster at http://127.0.0.1:8265" in (tmp_path / "studio" / "app.log").read_text()
        run_id = client.predict(spec=durable_spec(tiny_model_dir, "on-ray"), api_name="/launch")["run_id"]
        store = Store(db)
        run = helpers.wait_status(store, run_id, ("finished", "failed"), 240)
        assert run["status"] == "finished", run["error"]
        wait_for(lambda: job_status(run["ray_job_id"]) == "SUCCEEDED", 30, "the job to succeed")
        assert_same_run(record(store, run_id), reference)
        assert not any("8265" in r["message"] for r in store.get_logs(run_id))
    finally:
        stop_app(app)


def test_stop_resume_kill_and_restart_on_ray(ray_cluster, postgres_server, tmp_path, tiny_model_dir, reference):
    """One run through all of it, ending like the uninterrupted local run: Stop (the job is stopped, the worker
    checkpoints), Resume (a new job from the checkpoint), its worker killed with SIGKILL (the run fails with the
    job's last lines), Resume, the app killed and started again (the job is adopted, not restarted)."""
    db = postgres_server.create_database()
    data_dir = tmp_path / "studio"
    store = Store(db)
    # Every training step takes 2 s more: each action below lands while the run trains.
    app, client = ray_app(data_dir, db, tiny_model_dir, faults="train_step@1+=delay")
    try:
        run_id = client.predict(spec=durable_spec(tiny_model_dir, "chaos"), api_name="/launch")["run_id"]
        wait_for(lambda: len(store.get_metrics(run_id, names=["loss"])) >= 1, 180, "a training step")
        first_job = store.get_run(run_id)["ray_job_id"]
        client.predict(run_id=run_id, api_name="/stop")
        run = helpers.wait_status(store, run_id, ("stopped", "failed"), 60)
        assert run["status"] == "stopped", run["error"]
        assert store.latest_checkpoint(run_id) is not None  # saved on SIGTERM, within the grace
        wait_for(lambda: job_status(first_job) == "STOPPED", 30, "the job to be stopped")
        # Ray reports STOPPED while a loaded machine may still be tearing the old worker down: the SIGKILL below
        # is for the next job's worker, so wait until the only worker of the run is that one.
        wait_for(lambda: worker_pid(run_id, data_dir) is None, 60, "the stopped job's worker to exit")

        client.predict(run_id=run_id, api_name="/resume")
        wait_for(lambda: (r := store.get_run(run_id))["status"] == "running" and r["ray_job_id"] != first_job
                 and worker_pid(run_id, data_dir), 120, "a new job")
        steps = len(store.get_metrics(run_id, names=["loss"]))
        wait_for(lambda: len(store.get_metrics(run_id, names=["loss"])) > steps, 60, "a step of the new job")
        os.kill(worker_pid(run_id, data_dir), signal.SIGKILL)
        run = helpers.wait_status(store, run_id, ("failed",), 60)
        assert "Ray job" in run["error"] and "FAILED" in run["error"] and "last lines" in run["error"], run["error"]

        client.predict(run_id=run_id, api_name="/resume")
        wait_for(lambda: store.get_run(run_id)["status"] == "running" and worker_pid(run_id, data_dir), 120,
                 "a third job")
        third_job = store.get_run(run_id)["ray_job_id"]
        app.kill()  # no shutdown: the job goes on while no studio watches
        app.wait()
        app, client = ray_app(data_dir, db, tiny_model_dir, faults="train_step@1+=delay")
        run = store.get_run(run_id)
        assert run["ray_job_id"] == third_job and job_status(third_job) in ("RUNNING", "SUCCEEDED")
        run = helpers.wait_status(store, run_id, ("finished", "failed"), 240)
        assert run["status"] == "finished", run["error"]
        assert run["ray_job_id"] == third_job  # adopted, never submitted again
    finally:
        stop_app(app)
    assert_same_run(record(store, run_id), reference)
    logs = [r["message"] for r in store.get_logs(run_id)]
    assert sum("submitted to the Ray cluster" in m for m in logs) == 3, logs


def test_a_job_stopped_from_outside_and_a_head_down_interrupt_the_run_and_it_resumes(
        ray_cluster, postgres_server, tmp_path, tiny_model_dir, reference):
    """Faults of a lab's cluster, not of the run: its job stopped with Ray's own client (a node drained, an operator's
    `ray job stop`), then the Ray head stopped while the run trains and started again later. Each time the run is
    interrupted (never failed, never "running" forever), the studio says the cluster does not answer while it is
    down and starts nothing, and the run resumes by itself and ends like the uninterrupted local run."""
    from ray.job_submission import JobSubmissionClient

    from app.runtime.worker import OUTSIDE_STOP
    from tests.conftest import ray_answers, start_ray_head, stop_ray_head

    db = postgres_server.create_database()
    data_dir = tmp_path / "studio"
    store = Store(db)
    messages = lambda: [r["message"] for r in store.get_logs(run_id)]  # noqa: E731
    # Every training step takes 2 s more: each fault lands while the run trains.
    port = free_port()
    app = start_app(data_dir, port, "--ray-address", ray_cluster, "--db", db, "--shutdown-grace", "20",
                    "--heartbeat-timeout", "12", "--model-root", tiny_model_dir,
                    env={"A2PO_FAULTS": "train_step@1+=delay"})
    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    try:
        run_id = client.predict(spec=durable_spec(tiny_model_dir, "lost"), api_name="/launch")["run_id"]
        wait_for(lambda: len(store.get_metrics(run_id, names=["loss"])) >= 1, 180, "a training step")
        first_job = store.get_run(run_id)["ray_job_id"]
        JobSubmissionClient(ray_cluster).stop_job(first_job)
        wait_for(lambda: OUTSIDE_STOP in messages() or any("lost the worker" in m for m in messages()), 60,
                 "the stop from outside to be recorded")
        wait_for(lambda: (r := store.get_run(run_id))["status"] == "running" and r["ray_job_id"] != first_job,
                 120, "the run to resume in a new job")
        assert any(m.startswith("Resumed automatically") for m in messages()), messages()

        steps = len(store.get_metrics(run_id, names=["loss"]))
        wait_for(lambda: len(store.get_metrics(run_id, names=["loss"])) > steps, 60, "a step of the new job")
        assert len(store.get_metrics(run_id, names=["loss"])) < MAX_STEPS, "the run ended before the head stopped"
        stop_ray_head()
        try:
            assert not ray_answers()
            # The node is gone, and its processes with it, whatever Ray left running.
            if pid := worker_pid(run_id, data_dir):
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: any("does not answer and the worker's heartbeat stopped" in m for m in messages()),
                     120, "the run to be interrupted while the cluster is down")
            # Interrupted, then queued again by the studio's next pass: resumed, waiting for the cluster.
            wait_for(lambda: store.get_run(run_id)["status"] == "queued", 30, "the interrupted run to be queued again")
            assert client.predict(api_name="/limits")["runs_go_to"].get("error")
            time.sleep(5)
            run = store.get_run(run_id)
            assert run["status"] == "queued" and run["launch_failures"] == 0, run  # no start tried meanwhile
        finally:
            start_ray_head()
        run = helpers.wait_status(store, run_id, ("finished", "failed"), 240)
        assert run["status"] == "finished", run["error"]
    finally:
        stop_app(app)
    assert_same_run(record(store, run_id), reference)
    assert sum("submitted to the Ray cluster" in m for m in messages()) == 3, messages()


def test_every_page_says_when_the_cluster_does_not_answer():
    from types import SimpleNamespace

    from app.web.banner import CLUSTER_DOWN, LOCK_LOST, studio_problem

    scheduler = SimpleNamespace(lock_problem=None, cluster_problem=None)
    assert studio_problem(SimpleNamespace(scheduler=scheduler)) is None
    scheduler.cluster_problem = "Could not list the nodes of the Ray cluster: <ray-head> refused"
    assert studio_problem(SimpleNamespace(scheduler=scheduler)) == CLUSTER_DOWN and "<ray-head>" not in CLUSTER_DOWN
    scheduler.lock_problem = "lost"
    assert studio_problem(SimpleNamespace(scheduler=scheduler)) == LOCK_LOST


def test_a_worker_that_cannot_see_the_data_folder_fails_with_the_reason(ray_cluster, postgres_server, tmp_path,
                                                                       tiny_model_dir):
    """A node that does not mount the studio's data folder: the worker finds no check file there and fails the run
    with that reason, not a traceback (here the folder holds another studio's check file, as a node would whose
    path holds a folder of its own instead of the shared one)."""
    from app.runtime.ray_backend import RayCluster
    from app.runtime.scheduler import Scheduler

    db = postgres_server.create_database()
    store = Store(db)
    manager = Scheduler(store, tmp_path / "data", poll_interval=0.2, ray=RayCluster(ray_cluster))
    run_id = manager.submit(durable_spec(tiny_model_dir, "unseen"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / ".a2po-data-folder").write_text("another studio's folder\n")
    manager.folder.token = lambda: "this studio's token"  # what the studio would pass: not what the node sees
    started = time.monotonic()
    manager.start()
    try:
        run = helpers.wait_status(store, run_id, ("failed", "finished"), 120)
    finally:
        manager.close()
    assert run["status"] == "failed" and "cannot see the studio's data folder" in run["error"], run["error"]
    assert "Traceback" not in run["error"] and time.monotonic() - started < 120


def test_the_worker_drops_credentials_it_was_not_given_on_purpose():
    """A Ray job starts from its node's environment: the worker keeps only the credentials the studio passed."""
    import subprocess
    import sys

    from app.runtime.processes import with_project_path

    env = with_project_path({"PATH": os.environ["PATH"], "NODE_API_KEY": "node", "AWS_SECRET_ACCESS_KEY": "node",
                             "HF_TOKEN": "studio", "A2PO_PASSED_SECRETS": "HF_TOKEN"})
    code = ("import json, os; from app.runtime.credentials import drop_secrets; drop_secrets(); "
            "print(json.dumps(sorted(k for k in os.environ if k in ('NODE_API_KEY', 'AWS_SECRET_ACCESS_KEY', "
            "'HF_TOKEN'))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == '["HF_TOKEN"]'


def test_the_studio_imports_ray_only_with_ray_address():
    """Ray is optional (the `cluster` extra): the studio's modules never import it by themselves."""
    import subprocess
    import sys

    from app.runtime.processes import with_project_path

    code = ("import sys, app.__main__, app.runtime.scheduler, app.runtime.worker, app.web.api; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], env=with_project_path(os.environ), capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
