"""What a visitor reads of the texts processes wrote (issue 35, item 3): a run's error and log lines go through one
scrubber (`storage.secrets.scrub_text`), so a dead worker's log tail, whose first line is the worker's command
line with `--db <database URL>`, shows neither the database URL nor the server's paths. A real worker on
PostgreSQL, killed with SIGKILL as the kernel's OOM killer kills it."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from app.access.auth import Auth
from app.access.gate import Services
from app.access.policy import Policy
from app.runtime.scheduler import Devices, Scheduler
from app.web.api import run_summary
from app.web.pages.run.builders import controls_view, logs_view
from storage import Store
from storage.secrets import HIDDEN, scrub_secrets, scrub_text
from tests import postgres
from tests.runtime.test_durability import durable_spec, wait_status

DATA = "/srv/studio/data"

SCRUBBED = [
    # The worker's command line as the scheduler writes it into the worker's log.
    ("=== 2026-01-02 10:00:00 /opt/venv/bin/python -m app.runtime.worker --db "
     "postgresql+psycopg://studio@/test_3?host=%2Ftmp%2Fa2po-pg-x%2Fsocket&port=5432 --run-id 3 --data-dir "
     f"{DATA}",
     f"=== 2026-01-02 10:00:00 …/python -m app.runtime.worker --db postgresql+psycopg://{HIDDEN} --run-id 3 "
     f"--data-dir {DATA}"),
    ("could not connect: postgresql://alice:pw@db.internal:5432/studio", f"could not connect: postgresql://{HIDDEN}"),
    ("sqlite:////srv/elsewhere/studio.db is locked", f"sqlite://{HIDDEN} is locked"),
    ("HTTPConnectionPool(host='10.1.2.3', port=8265): url: /api/jobs/", f"HTTPConnectionPool(host={HIDDEN}, "
     "port=8265): url: …/jobs"),
    ("see http://10.1.2.3:8265/#/jobs/raysubmit_1", f"see http://{HIDDEN}"),
    ("ray://head:10001 refused", f"ray://{HIDDEN} refused"),
    ("http://localhost:7860/ and https://hf_user:hf_abc@huggingface.co/x", f"http://{HIDDEN} and https://{HIDDEN}"),
    ("connecting to 10.1.2.3:6379 and [fd00:1:2::3]:8265", f"connecting to {HIDDEN} and {HIDDEN}"),
    ('connection to server on socket "/tmp/a2po-pg-x/socket/.s.PGSQL.5432" failed',
     'connection to server on socket "…/.s.PGSQL.5432" failed'),
    ("host=/tmp/pg dbname=studio user=studio password=s3cret", f"host={HIDDEN} dbname=studio user=studio "
     f"password={HIDDEN}"),
    ('File "/usr/lib/python3/dist-packages/torch/nn/module.py", line 3, in forward',
     'File "<site-packages>/torch/nn/module.py", line 3, in forward'),
    ('File "/home/alice/secret-project/rewards.py", line 9', 'File "…/rewards.py", line 9'),
    ("read /srv/studio/database.db and /srv/studio/data-old/x.json", "read …/database.db and …/x.json"),
    ("file:///etc/passwd", "file://…/passwd"),
]
KEPT = [
    f"checkpoint {DATA}/runs/run-3/checkpoint-4 saved",  # the run's own folder: its spec names it anyway
    "loss 0.25 at step 3/8, 12.5 it/s, and/or 2026-01-02 12:34:56.789 (GET /status)",
    "see https://huggingface.co/docs/transformers/main_classes/trainer#trainingarguments",
    "torch 2.5.1, ./relative/path, ~/notes.txt, a:b",
]


@pytest.mark.parametrize(("text", "shown"), SCRUBBED, ids=range(len(SCRUBBED)))
def test_the_scrubber_hides_addresses_credentials_and_outside_paths(text, shown):
    assert scrub_text(text, DATA) == shown


@pytest.mark.parametrize("text", KEPT, ids=range(len(KEPT)))
def test_the_scrubber_keeps_what_is_not_the_servers(text):
    assert scrub_text(text, DATA) == text


def test_the_scrubber_hides_a_named_address_and_knows_no_data_folder_by_default():
    text = "the dashboard at http://head.lab.example:8265 (head.lab.example) said no; /srv/studio/data/runs/x.log"
    shown = scrub_text(text, hidden=["http://head.lab.example:8265"])
    assert shown == f"the dashboard at {HIDDEN} ({HIDDEN}) said no; …/x.log"
    assert scrub_text(None) == "" and scrub_text("") == ""
    assert scrub_secrets({"config": {"hub_token": "x", "lr": 1}, "x": [{"api_key": 1}]}) == {"config": {"lr": 1},
                                                                                             "x": [{}]}


def test_a_dead_workers_log_tail_reaches_no_visitor_with_the_database_url(postgres_server, tmp_path,
                                                                          tiny_model_dir):
    """A worker on a PostgreSQL server that asks for a password, killed with SIGKILL while it runs: the run's
    error (the tail of the worker's log) names neither the database, its role and socket, nor the server's paths,
    wherever a visitor reads it: /status and /list_runs, the Run page's error box and log lines."""
    url = postgres_server.create_database(password=True)
    with_password = url.replace(f"{postgres.PASSWORD_ROLE}@", f"{postgres.PASSWORD_ROLE}:s3cret%20pg%20pass@")
    database = url.split("://", 1)[1].split("@", 1)[1].split("?", 1)[0]
    store = Store(with_password)
    data_dir = tmp_path / "data"
    manager = Scheduler(store, data_dir, devices=Devices(), poll_interval=0.1, launch_backoff=(0.5,),
                         worker_env=Policy(data_dir).worker_environment())
    services = Services(store, manager, data_dir, auth=Auth())
    run_id = manager.submit(durable_spec(tiny_model_dir, "victim", max_steps=100_000))
    manager.start()
    try:
        running = wait_status(store, run_id, ("running",), timeout=300)
        os.kill(running["pid"], signal.SIGKILL)
        run = wait_status(store, run_id, ("failed",), timeout=120)
    finally:
        manager.close()
    assert "without recording an end" in run["error"] and f"--db postgresql+psycopg://{HIDDEN}" in run["error"]
    log_id = store.last_ids(run_id)["logs"]
    seen = {"stored error": run["error"],
            "/status": run_summary(run, services.public_text)["error"],
            "/list_runs": [run_summary(r, services.public_text) for r in store.list_runs()][0]["error"],
            "Run page error": controls_view(services, run)["error"].value,
            "Run page logs": logs_view(services, run_id, log_id)["logs"]}
    server_folder, python = str(postgres_server.folder), os.path.dirname(sys.executable)
    for where, text in seen.items():
        assert "without recording an end" in text, where
        for secret in (database, f"{postgres.PASSWORD_ROLE}@", "s3cret", server_folder, python):
            assert secret not in text, (where, secret, text)
    # A row written before the scrubber (or by a chunk's own process) is scrubbed when it is read.
    raw = f"Worker exited with code -9 without recording an end; last lines:\n=== {sys.executable} --db {url}"
    store.add_log(run_id, raw, level="ERROR")
    old = {**run, "error": raw}
    for text in (run_summary(old, services.public_text)["error"], controls_view(services, old)["error"].value,
                 logs_view(services, run_id, store.last_ids(run_id)["logs"])["logs"]):
        assert database not in text and server_folder not in text and python not in text, text
    store.close()
