"""A studio safe to share: every attack an outsider tried through the named API is refused (naming the field),
nothing is stored for a refused spec, a benign spec still works; logins decide who may act; `--public` limits
hold and are reported. Real `python -m app` processes driven with `gradio_client`, the tiny model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from app.access.allowlist import STUDY_LEFT_OUT
from app.access.auth import Auth, User
from app.access.gate import Services
from app.runtime.scheduler import Scheduler
from app.web.api import public_spec
from app.web.pages.compare import study_choices, study_runs
from storage import Store
from tests.helpers import wait_for
from tests.web.test_app_api import ROOT, free_port, start_app, stop_app, tiny_spec

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


def studio(tmp_path_factory, tiny_model_dir: str, name: str, *args: str, env: dict | None = None):
    """A studio process whose models/ root holds the tiny model; yields (client factory, data dir, model path)."""
    data_dir = tmp_path_factory.mktemp(name)
    model = data_dir / "models" / "tiny"
    shutil.copytree(tiny_model_dir, model)
    port = free_port()
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        proc = start_app(data_dir, port, *args)
    finally:
        os.environ.clear()
        os.environ.update(old)
    url = f"http://127.0.0.1:{port}/"
    return proc, url, data_dir, str(model)


@pytest.fixture(scope="module")
def local(tmp_path_factory, tiny_model_dir) -> Iterator[tuple[Client, Path, str, str]]:
    proc, url, data_dir, model = studio(tmp_path_factory, tiny_model_dir, "local",
                                       env={"HF_TOKEN": "hf_server_secret", "MY_API_KEY": "k"})
    try:
        yield Client(url, verbose=False), data_dir, model, url
    finally:
        stop_app(proc)


ATTACKS = [
    ({"config": {"trust_remote_code": True}}, "config.trust_remote_code: reaches outside the run"),
    ({"config": {"model_init_kwargs": {"trust_remote_code": True}}}, "config.model_init_kwargs: reaches outside"),
    ({"config": {"push_to_hub": True, "hub_model_id": "owner/repo"}}, "config.push_to_hub: reaches outside the run"),
    ({"config": {"hub_token": "hf_stolen"}}, "config.hub_token: not allowed in a run spec: it is a credential"),
    ({"dataset": {"source": "file", "path": "/etc/passwd"}}, "dataset.path: /etc/passwd is not an uploaded file"),
    ({"dataset": {"source": "file", "path": "../studio.db"}}, "dataset.path: ../studio.db is not an uploaded file"),
    ({"dataset": {"source": "hub", "name": "../x"}}, "dataset.name: Enter a hub dataset id"),
    ({"dataset": {"source": "hub", "name": "/etc"}}, "dataset.name: Enter a hub dataset id"),
    ({"config": {"values_path": "/etc/passwd"}}, "config.values_path: not allowed in a run spec"),
    ({"config": {"output_dir": "/tmp/elsewhere"}}, "config.output_dir: not allowed in a run spec"),
    ({"config": {"report_to": "wandb"}}, "config.report_to: not allowed in a run spec"),
    ({"config": {"dataloader_num_workers": 512}}, "config.dataloader_num_workers: not allowed in a run spec"),
    ({"dataset": {"num_prompts": 10**12}}, "dataset.num_prompts: Number of prompts must be at most 100000 on this"),
    ({"dataset": {"eval_size": -5}}, "dataset.eval_size: dataset.eval_size must be a whole number >= 0"),
    ({"dataset": {"difficulty": 99}}, "dataset.difficulty: dataset.difficulty must be a whole number from 1 to 4"),
    ({"name": "x" * 1_000_000}, "name: Run name: at most 200 characters on this studio"),
    ({"peft": {"r": 4, "target_modules": "all", "bogus": 1}}, "peft: peft must be null (no LoRA), or an object"),
    ({"model": "/etc"}, "model: /etc is not under a model folder of this studio"),
]


def merged(spec: dict, change: dict) -> dict:
    """`spec` with `change`: config keys added; a dataset with a source replaces, one without adds keys."""
    out = {**spec, **{k: v for k, v in change.items() if k not in ("config", "dataset")}}
    if "config" in change:
        out["config"] = {**spec["config"], **change["config"]}
    if "dataset" in change:
        out["dataset"] = change["dataset"] if "source" in change["dataset"] else {**spec["dataset"],
                                                                                   **change["dataset"]}
    return out


@pytest.mark.parametrize(("change", "message"), ATTACKS, ids=[m.split(":")[0] for _, m in ATTACKS])
def test_each_attack_is_refused_and_stores_nothing(local, change, message):
    client, _, model, _ = local
    before = client.predict(api_name="/list_runs")
    spec = merged(tiny_spec(model, "attack"), change)
    with pytest.raises(AppError) as refused:
        client.predict(spec=spec, api_name="/launch")
    assert message in str(refused.value)
    assert len(str(refused.value)) < 5000
    assert client.predict(api_name="/list_runs") == before


def test_a_benign_spec_runs_without_the_servers_secrets(local):
    client, data_dir, model, _ = local
    run = client.predict(spec=tiny_spec(model, "benign", max_steps=200), api_name="/launch")
    status = wait_for(lambda: (s := client.predict(run_id=run["run_id"], api_name="/status"))["status"] == "running"
                      and s, 120, "the run to start")
    from storage import Store

    pid = Store(data_dir / "studio.db").get_run(run["run_id"])["pid"]
    environment = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    names = {item.split("=", 1)[0] for item in environment}
    assert "HF_TOKEN" not in names and "MY_API_KEY" not in names and "PATH" in names
    assert Path(f"/proc/{pid}/cwd").resolve() == (data_dir / "cache" / "worker-cwd").resolve()
    assert "hf_" not in str(status["spec"])
    client.predict(run_id=run["run_id"], api_name="/stop")


def test_uploads_go_through_the_upload_endpoint(local, tmp_path):
    client, data_dir, model, _ = local
    data = tmp_path / "my data.jsonl"
    data.write_text("".join(f'{{"question": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(12)))
    uploaded = client.predict(file=handle_file(str(data)), api_name="/upload_dataset")
    assert uploaded["file"].startswith("uploads/") and uploaded["file"].endswith("-my_data.jsonl")
    assert (data_dir / "datasets" / uploaded["file"]).is_file()
    spec = {**tiny_spec(model, "uploaded", max_steps=1), "dataset": {"source": "file", "file": uploaded["file"],
                                                                     "eval_size": 2}}
    run = client.predict(spec=spec, api_name="/launch")
    status = client.predict(run_id=run["run_id"], api_name="/status")
    assert status["spec"]["dataset"]["file"] == uploaded["file"]  # what /launch accepts back
    from storage import Store

    stored = Store(data_dir / "studio.db").get_run(run["run_id"])["config"]["dataset"]["path"]
    assert stored == str((data_dir / "datasets" / uploaded["file"]).resolve())
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(AppError, match="Invalid file type"):  # Gradio's own check of the file box's types
        client.predict(file=handle_file(str(text)), api_name="/upload_dataset")


def test_logins_decide_who_may_act(tmp_path_factory, tiny_model_dir):
    proc, url, _, model = studio(tmp_path_factory, tiny_model_dir, "auth", "--auth", "alice:wonderland",
                                 "--auth", "bob:builder", "--auth", "root:toor:admin")
    try:
        anonymous = Client(url, verbose=False)
        with pytest.raises(AppError, match="Launching runs needs a login on this studio"):
            anonymous.predict(spec=tiny_spec(model, "anon"), api_name="/launch")
        assert anonymous.predict(api_name="/list_runs") == []
        with pytest.raises(AppError, match="Wrong user name or password"):
            anonymous.predict(username="alice", password="nope", api_name="/login")

        def as_user(name: str, password: str) -> Client:
            token = anonymous.predict(username=name, password=password, api_name="/login")["token"]
            return Client(url, verbose=False, headers={"x-a2po-token": token})

        alice, bob, root = as_user("alice", "wonderland"), as_user("bob", "builder"), as_user("root", "toor")
        run_id = alice.predict(spec=tiny_spec(model, "alices", max_steps=500), api_name="/launch")["run_id"]
        listed = anonymous.predict(api_name="/list_runs")  # viewers see every run, and who launched it
        assert listed[0]["id"] == run_id and listed[0]["owner"] == "alice"
        for action in ("/stop", "/delete"):
            with pytest.raises(AppError, match="Stopping, resuming or deleting a run needs a login"):
                anonymous.predict(run_id=run_id, api_name=action)
            with pytest.raises(AppError, match=f"Run #{run_id} was launched by alice: only they"):
                bob.predict(run_id=run_id, api_name=action)
        bogus = Client(url, verbose=False, headers={"x-a2po-token": "YWxpY2V8OTk5OTk5OTk5OQ==.AAAA"})
        with pytest.raises(AppError, match="needs a login"):
            bogus.predict(run_id=run_id, api_name="/stop")
        assert root.predict(run_id=run_id, api_name="/stop")["status"] in ("stopping", "stopped")
        wait_for(lambda: anonymous.predict(run_id=run_id, api_name="/status")["status"] == "stopped", 120, "stop")
        assert alice.predict(run_id=run_id, api_name="/delete") == {"deleted": run_id}
    finally:
        stop_app(proc)


def test_public_limits_hold_and_are_reported(tmp_path_factory, tiny_model_dir):
    proc, url, _, model = studio(tmp_path_factory, tiny_model_dir, "public", "--public", "--auth", "ann:pw",
                                 "--limit", "queued_per_user=1", "--limit", "run_minutes=0.1")
    try:
        anonymous = Client(url, verbose=False)
        reported = anonymous.predict(api_name="/limits")
        assert reported["public"] and reported["login_required"] and not reported["allow_hub"]
        limits = reported["limits"]
        assert limits["max_value_samples"] == 16 and limits["max_completion_length"] == 512
        assert limits["max_prompts"] == 2000 and limits["upload_mb"] == 10 and limits["queue_size"] == 20
        assert limits["disk_quota_gb"] == 30 and limits["queued_per_user"] == 1 and limits["run_minutes"] == 0.1
        # The page shows each limit next to its field.
        with urllib.request.urlopen(url + "config", timeout=30) as response:
            page = response.read().decode()
        for text in ("At most 16 here.", "At most 512 here.", "At most 2000 here.", "at most 10 MB",
                     "This studio's limits:", "0.1 minutes of wall-clock time per run"):
            assert text in page, text

        token = anonymous.predict(username="ann", password="pw", api_name="/login")["token"]
        ann = Client(url, verbose=False, headers={"x-a2po-token": token})
        for change, message in [({"num_value_samples": 32}, "must be at most 16 on this studio (got 32)"),
                                ({"max_completion_length": 4096}, "must be at most 512 on this studio (got 4096)"),
                                ({"max_steps": 10**6}, "must be at most 2000 on this studio")]:
            with pytest.raises(AppError, match=message.replace("(", r"\(").replace(")", r"\)")):
                ann.predict(spec=tiny_spec(model, "big", **change), api_name="/launch")
        with pytest.raises(AppError, match="Hub models are off on this studio"):
            ann.predict(spec={**tiny_spec(model, "hub"), "model": "someone/model"}, api_name="/launch")

        # One queued or running run per user; the wall-clock limit stops a run (checkpointed, resumable).
        first = ann.predict(spec=tiny_spec(model, "first", max_steps=2000), api_name="/launch")["run_id"]
        with pytest.raises(AppError, match="the limit is 1 queued or running runs per user"):
            ann.predict(spec=tiny_spec(model, "second"), api_name="/launch")
        stopped = wait_for(lambda: (s := ann.predict(run_id=first, api_name="/status"))["status"] == "stopped" and s,
                           120, "the wall-clock limit")
        assert stopped["stop_reason"] == "limit"
    finally:
        stop_app(proc)


def test_a_public_studio_without_logins_is_read_only(tmp_path_factory, tiny_model_dir):
    proc, url, _, model = studio(tmp_path_factory, tiny_model_dir, "readonly", "--public",
                                 "--limit", "disk_quota_gb=1e-9")
    try:
        client = Client(url, verbose=False)
        with pytest.raises(AppError, match="This public studio has no sign-in configured, so it is read-only"):
            client.predict(spec=tiny_spec(model, "x"), api_name="/launch")
        assert client.predict(api_name="/list_runs") == []
    finally:
        stop_app(proc)


def test_the_disk_quota_refuses_a_launch(tmp_path_factory, tiny_model_dir):
    proc, url, _, model = studio(tmp_path_factory, tiny_model_dir, "quota", "--limit", "disk_quota_gb=1e-9")
    try:
        client = Client(url, verbose=False)
        with pytest.raises(AppError, match=r"over its disk quota of 1e-09 GB"):
            client.predict(spec=tiny_spec(model, "x"), api_name="/launch")
        time.sleep(0.1)
        assert client.predict(api_name="/list_runs") == []
    finally:
        stop_app(proc)


def test_hub_columns_are_probed_by_streaming(monkeypatch):
    from a2po import data

    calls = []

    def fake_load_dataset(name, config=None, split=None, streaming=False, **kwargs):
        calls.append(streaming)
        return iter([{"question": f"q{i}", "answer": str(i)} for i in range(10**6)])

    monkeypatch.setattr(data, "load_dataset", fake_load_dataset)
    head = data.peek_dataset("openai/gsm8k", "train", "main", rows=3)
    assert calls == [True] and len(head) == 3 and head.column_names == ["question", "answer"]


def run_app(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m app` run to its end (it is expected to refuse to start), in a clean offline environment."""
    base = {k: v for k, v in os.environ.items() if k not in ("SYSTEM", "SPACE_ID", "OAUTH_CLIENT_ID",
                                                              "OAUTH_CLIENT_SECRET", "OAUTH_SCOPES",
                                                              "OPENID_PROVIDER_URL")}
    return subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path / "data"), "--port",
                           str(free_port()), *args], cwd=ROOT, env={**base, "HF_HUB_OFFLINE": "1", **(env or {})},
                          capture_output=True, text=True, timeout=120)


OAUTH_SPACE = {"SYSTEM": "spaces", "SPACE_ID": "teacher/studio", "OAUTH_CLIENT_ID": "id", "OAUTH_CLIENT_SECRET": "s",
               "OAUTH_SCOPES": "openid profile", "OPENID_PROVIDER_URL": "https://huggingface.co"}


def test_hf_oauth_is_refused_off_a_space(tmp_path):
    # Off a Space, Gradio's login button would sign every visitor in as this machine's Hugging Face account.
    for args, env in [(("--hf-oauth", "--admin", "teacher"), {}),
                      ((), {"OAUTH_CLIENT_ID": "id"}),  # the variable that turns --hf-oauth on by itself
                      (("--hf-oauth",), {**OAUTH_SPACE, "SYSTEM": "docker"}),  # OAuth variables but not a Space
                      (("--hf-oauth",), {k: v for k, v in OAUTH_SPACE.items() if k != "SPACE_ID"})]:
        result = run_app(tmp_path, *args, env=env)
        assert result.returncode == 1, (args, env, result.stderr[-2000:])
        assert "only on a Hugging Face Space" in result.stderr and "--auth-file" in result.stderr, result.stderr
        assert not (tmp_path / "data" / "studio.db").exists()  # refused before anything started
    # On a Space without `hf_oauth: true` in its README header, Gradio would fail at launch: said at once instead.
    result = run_app(tmp_path, "--hf-oauth", env={"SYSTEM": "spaces", "SPACE_ID": "teacher/studio"})
    assert result.returncode == 1 and "hf_oauth: true" in result.stderr and "OAUTH_CLIENT_ID" in result.stderr


def test_the_space_is_detected_as_gradio_detects_it(monkeypatch):
    from gradio.utils import get_space

    from app.access.auth import oauth_problem, on_a_space

    for env in [{}, {"SPACE_ID": "a/b"}, {"SYSTEM": "spaces"}, {"SYSTEM": "spaces", "SPACE_ID": "a/b"},
                {"SYSTEM": "spaces", "SPACE_ID": ""}, {"SYSTEM": "docker", "SPACE_ID": "a/b"}]:
        for name in ("SYSTEM", "SPACE_ID"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert on_a_space() == (get_space() is not None), env
    assert oauth_problem(False, {}) is None  # no OAuth asked: nothing to refuse
    assert "--auth-file" in oauth_problem(True, {})
    assert oauth_problem(True, OAUTH_SPACE) is None or "gradio[oauth]" in oauth_problem(True, OAUTH_SPACE)


def test_gradio_temp_dir_is_not_a_dataset_folder(tmp_path_factory, tiny_model_dir, tmp_path):
    # An operator's GRADIO_TEMP_DIR may be a shared folder: of it, only files Gradio received as uploads are data.
    shared = tmp_path / "shared-tmp"
    (shared / ("a" * 64)).mkdir(parents=True)  # laid out like Gradio's upload folders, but not received here
    for path in (shared / "notes.jsonl", shared / ("a" * 64) / "other-app.jsonl"):
        path.write_text('{"question": "1+1?", "answer": "2"}\n' * 8)
    proc, url, data_dir, model = studio(tmp_path_factory, tiny_model_dir, "tempdir",
                                        env={"GRADIO_TEMP_DIR": str(shared)})
    try:
        client = Client(url, verbose=False)
        for path in (shared / "notes.jsonl", shared / ("a" * 64) / "other-app.jsonl"):
            with pytest.raises(AppError, match="is not an uploaded file"):
                client.predict(spec={**tiny_spec(model, "shared"), "dataset": {"source": "file", "file": str(path)}},
                               api_name="/launch")
        assert client.predict(api_name="/list_runs") == []
        # A file Gradio received (the route behind the form's file box) is accepted, and kept in datasets/.
        import httpx

        data = tmp_path / "mine.jsonl"
        data.write_text('{"question": "2+2?", "answer": "4"}\n' * 8)
        with data.open("rb") as f:
            received = httpx.post(url + "gradio_api/upload", files={"files": f}, timeout=30).json()[0]
        assert Path(received).is_relative_to(shared.resolve())
        spec = {**tiny_spec(model, "received", max_steps=1), "dataset": {"source": "file", "file": received}}
        run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
        from storage import Store

        kept = Path(Store(data_dir / "studio.db").get_run(run_id)["config"]["dataset"]["path"])
        assert kept.parent == data_dir / "datasets" / "uploads" and kept.read_text() == data.read_text()
    finally:
        stop_app(proc)


def test_the_studio_works_in_the_workers_empty_directory(tmp_path_factory, tiny_model_dir):
    # A name that is not an absolute path inside the studio's folders is a hub id, in the studio's process as in
    # its workers: both run in <data-dir>/cache/worker-cwd, never in the folder the operator started it from.
    proc, _, data_dir, _ = studio(tmp_path_factory, tiny_model_dir, "cwd")
    try:
        worker_cwd = (data_dir / "cache" / "worker-cwd").resolve()
        assert Path(f"/proc/{proc.pid}/cwd").resolve() == worker_cwd
        assert list(worker_cwd.iterdir()) == []
    finally:
        stop_app(proc)


def test_only_the_studio_puts_runs_into_a_study(tmp_path):
    """Study membership is a label on each run: a label sent in a spec is left out, with a warning, on every launch
    path (issue 35, item 2), and the study views read only the runs of the study's owner."""
    store = Store(tmp_path / "studio.db")
    services = Services(store, Scheduler(store, tmp_path), tmp_path,  # never started: the runs stay queued
                        auth=Auth({"alice": ("pw-a", False), "mallory": ("pw-m", False)}))
    alice, mallory = User("alice"), User("mallory")
    pairs = services.launch_pair({"name": "duel", "config": {"max_steps": 8}}, alice, seeds=[0, 1])
    mine = sorted(i for pair in pairs for i in pair)
    label = store.get_run(mine[0])["config"]["study"]
    assert study_runs(store, label["id"]) == mine
    # Mallory's GRPO run labelled with Alice's study (any /status shows the label), and Alice's own run re-sent from
    # /status to /launch as docs/api.md invites: plain runs, and the response and the run's log say why.
    forged = {"name": "forged", "method": "grpo", "config": {"max_steps": 8}, "study": {**label, "seed": 2}}
    forged_id, forged_warnings = services.launch_run(forged, mallory)
    resent = public_spec(store.get_run(mine[1])["config"], services.policy.datasets_dir)
    resent_id, resent_warnings = services.launch_run(resent, alice)
    for run_id, warnings in ((forged_id, forged_warnings), (resent_id, resent_warnings)):
        assert "study" not in store.get_run(run_id)["config"] and STUDY_LEFT_OUT in warnings
        assert any(STUDY_LEFT_OUT in line["message"] for line in store.get_logs(run_id))
    # The study launchers label their runs themselves, whatever label the spec carries.
    seeded = services.launch_seeds({"name": "s", "study": label}, mallory, [0, 1])
    paired = [i for pair in services.launch_pair({"name": "p", "study": label}, mallory) for i in pair]
    swept = services.launch_sweep({"name": "w", "study": label}, mallory, {"learning_rate": [1e-5, 2e-5]})
    for ids in (seeded, paired, swept):
        labels = {store.get_run(i)["config"]["study"]["id"] for i in ids}
        assert len(labels) == 1 and label["id"] not in labels, labels
    assert study_runs(store, label["id"]) == mine
    # A forged row stored before the gate left labels out (the store keeps what it is given) is no run of the study.
    forged = {**store.get_run(forged_id)["config"], "study": {**label, "seed": 2}}
    old = services.scheduler.submit(forged, owner="mallory")
    assert store.get_run(old)["config"]["study"] == {**label, "seed": 2}
    assert study_runs(store, label["id"]) == mine
    assert [name for name, sid in study_choices(store) if sid == label["id"]][0].endswith("(4 runs)")
    store.close()
