"""What a lab's studio keeps to itself (issue 28): the Ray cluster's address never reaches a visitor (not in
/limits, run logs or error texts; a signed-in admin may read it), and a PostgreSQL password reaches the worker's
own store connection only, never its environment, its command line or a reward function."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest

from app.access.auth import Auth
from app.access.policy import Policy
from app.runtime.credentials import STORE_PASSWORD_FILE
from app.runtime.data_folder import DataFolder
from app.runtime.ray_backend import Node, RayCluster
from app.runtime.scheduler import Devices, Scheduler
from app.web.api import runs_go_to
from storage import Store
from tests import postgres
from tests.runtime.test_durability import durable_spec, wait_status

HEAD = "10.1.2.3"  # the private address of the cluster's head in these tests


class FakeJobsAPI:
    """Ray's `JobSubmissionClient` as far as the studio uses it, for a head whose errors and messages quote its
    address, as Ray's and requests' do."""

    accept = False

    def __init__(self, address: str) -> None:
        self.address = address

    def submit_job(self, submission_id: str, **_: object) -> str:
        if not self.accept:
            raise ConnectionError(f"HTTPConnectionPool(host='{HEAD}', port=8265): Max retries exceeded with url: "
                                  f"/api/jobs/ (connecting to {self.address})")
        return submission_id

    def get_job_info(self, job_id: str) -> SimpleNamespace:
        return SimpleNamespace(status="FAILED", driver_exit_code=1,
                               message=f"Job supervisor actor died; see {self.address}/#/jobs/{job_id}")

    def get_job_logs(self, job_id: str) -> str:
        return f"worker output\nTraceback: could not connect to {HEAD}:8265"

    def stop_job(self, job_id: str) -> None:
        pass


class Cluster(RayCluster):
    def nodes(self, fresh: bool = False) -> list[Node]:
        return [Node(ip=HEAD, cpus=2.0, gpus=0.0, head=True)]


@pytest.fixture
def cluster(monkeypatch) -> Cluster:
    """A cluster at http://HEAD:8265 behind `FakeJobsAPI` (Ray itself is never imported)."""
    ray = types.ModuleType("ray")
    jobs = types.ModuleType("ray.job_submission")
    jobs.JobSubmissionClient = FakeJobsAPI
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.job_submission", jobs)
    return Cluster(f"http://{HEAD}:8265")


def visible_texts(store: Store, run_id: int) -> str:
    """Everything about a run that any visitor reads: its row (error included) and its log lines."""
    return json.dumps(store.get_run(run_id), default=str) + "\n".join(r["message"] for r in store.get_logs(run_id))


def test_the_ray_clusters_address_reaches_no_visitor(cluster, tmp_path, tiny_model_dir):
    store = Store(tmp_path / "studio.db")
    manager = Scheduler(store, tmp_path / "data", ray=cluster, launch_backoff=())
    # Ray refuses the job: the run fails with Ray's error, without the head's address.
    refused = manager.submit(durable_spec(tiny_model_dir, "refused"))
    manager.tick()
    run = store.get_run(refused)
    assert run["status"] == "failed" and "Ray did not accept the job" in run["error"], run["error"]
    # Ray takes the job, which then fails: Ray's message and the job's output, without the address.
    FakeJobsAPI.accept = True
    try:
        failed = manager.submit(durable_spec(tiny_model_dir, "failed"))
        manager.tick()
        assert any("submitted to the Ray cluster as job" in r["message"] for r in store.get_logs(failed))
        manager.tick()
    finally:
        FakeJobsAPI.accept = False
    run = store.get_run(failed)
    assert run["status"] == "failed" and "FAILED" in run["error"] and "worker output" in run["error"], run["error"]
    for run_id in (refused, failed):
        assert HEAD not in visible_texts(store, run_id)
    assert HEAD not in manager.worker_output(failed)  # the Run page's Logs tab shows it
    # /limits: the address for a signed-in admin only.
    auth = Auth({"ada": ("pw", True), "bob": ("pw", False)})
    services = SimpleNamespace(scheduler=manager, auth=auth)
    assert runs_go_to(services, None) == {"backend": "ray", "nodes": 1, "gpus": 0, "cpus": 2}
    assert "address" not in runs_go_to(services, auth.user_from_token(auth.token_for("bob")))
    assert runs_go_to(services, auth.user_from_token(auth.token_for("ada")))["address"] == f"http://{HEAD}:8265"
    local = SimpleNamespace(scheduler=manager, auth=Auth())  # no logins: the operator reads it at the console
    assert "address" not in runs_go_to(local, auth.user_from_token(auth.token_for("ada")))
    store.close()


PROBE = '''
import json


def env_probe(completions, **kwargs):
    """Records the environment a reward function sees."""
    import os

    with open({dump!r}, "w") as f:
        json.dump(dict(os.environ), f)
    return [0.0 for _ in completions]
'''


@pytest.mark.slow
def test_a_password_in_pgpassword_reaches_the_workers_store_only(postgres_server, tmp_path, tiny_model_dir,
                                                                   monkeypatch):
    """A real worker on a server that asks for a password, given only in the studio's PGPASSWORD: the run
    finishes, and its reward function finds the password nowhere in its environment."""
    url = postgres_server.create_database(password=True)
    dump = tmp_path / "reward-env.json"
    (tmp_path / "probe.py").write_text(PROBE.format(dump=str(dump)))
    monkeypatch.setenv("A2PO_REWARD_MODULES", str(tmp_path / "probe.py"))
    monkeypatch.setenv("PGPASSWORD", postgres.PASSWORD)
    store = Store(url)  # the studio's own connection: libpq reads PGPASSWORD
    data_dir = tmp_path / "data"
    manager = Scheduler(store, data_dir, devices=Devices(), poll_interval=0.1, launch_backoff=(0.5,),
                         worker_env=Policy(data_dir).worker_environment())
    spec = {**durable_spec(tiny_model_dir, "pgpassword"), "action": "values", "rewards": [{"name": "env_probe"}]}
    run_id = manager.submit(spec)
    manager.start()
    try:
        run = wait_status(store, run_id, ("finished", "failed"), timeout=300)
    finally:
        manager.close()
    assert run["status"] == "finished", run["error"]
    seen = json.loads(dump.read_text())
    assert "PGPASSWORD" not in seen and not any("s3cret" in value for value in seen.values())
    assert "s3cret" not in " ".join(manager.worker_command(run_id, {}))  # `ps`, a Ray job's entrypoint
    assert "s3cret" not in DataFolder(data_dir).run_log(run_id).read_text() + visible_texts(store, run_id)
    assert (data_dir / STORE_PASSWORD_FILE).stat().st_mode & 0o777 == 0o600
    store.close()
    # A password in the URL takes the same way, off the command line.
    monkeypatch.delenv("PGPASSWORD")
    with_password = url.replace(f"{postgres.PASSWORD_ROLE}@", f"{postgres.PASSWORD_ROLE}:s3cret%20pg%20pass@")
    store = Store(with_password)
    other = Scheduler(store, tmp_path / "other", devices=Devices())
    assert "s3cret" not in other.worker_database()
    assert (tmp_path / "other" / STORE_PASSWORD_FILE).read_text() == postgres.PASSWORD
    store.close()
