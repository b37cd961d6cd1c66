"""Issue 45: what a stranger can make a `--public` studio read, render or compute, each through the route they would
use: Gradio's upload route and the page's own event (as the browser sends it, anonymously), the REST routes, the
named API, and a browser for what a page renders. One studio for the module (`--public`, alice signs in to act)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app.web.api import public_error, with_services
from storage import Store
from tests.web.test_app_api import free_port, start_app, stop_app

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


class Stranger:
    """A `--public --auth alice:alicepw` studio, and what an anonymous browser sends it."""

    def __init__(self, url: str, pid: int, data_dir: Path):
        self.url, self.pid, self.data_dir = url, pid, data_dir
        self.config = json.loads(urllib.request.urlopen(url + "config", timeout=60).read())

    def peak_mb(self) -> float:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) / 1024

    def event_of(self, elem_id: str, trigger: str) -> dict:
        target = next(c["id"] for c in self.config["components"] if c.get("props", {}).get("elem_id") == elem_id)
        return next(d for d in self.config["dependencies"] if [target, trigger] in [list(t) for t in d["targets"]])

    def inputs(self, dependency: dict, **by_elem_id) -> list:
        """The event's inputs at their page values, those named by elem_id replaced."""
        components = {c["id"]: c.get("props", {}) for c in self.config["components"]}
        return [by_elem_id.get(components[i].get("elem_id", "").replace("-", "_"), components[i].get("value"))
                for i in dependency["inputs"]]

    def send(self, dependency: dict, data: list) -> dict:
        """The event as an anonymous browser sends it (no cookie, no token): join the queue, read its answer."""
        session = uuid.uuid4().hex[:11]
        body = json.dumps({"data": data, "fn_index": dependency["id"], "session_hash": session}).encode()
        urllib.request.urlopen(urllib.request.Request(self.url + "gradio_api/queue/join", data=body,
                                                      headers={"Content-Type": "application/json"}), timeout=60)
        for raw in urllib.request.urlopen(self.url + f"gradio_api/queue/data?session_hash={session}", timeout=300):
            line = raw.decode().strip()
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                return json.loads(line[5:])
        raise AssertionError("the event never completed")

    def upload(self, name: str, content: bytes) -> dict:
        """Gradio's upload route, anonymously (what a page's file box sends), as the event's file value."""
        boundary = uuid.uuid4().hex
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n")
        body = head.encode() + content + f"\r\n--{boundary}--\r\n".encode()
        request = urllib.request.Request(self.url + "gradio_api/upload", data=body,
                                         headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        path = json.loads(urllib.request.urlopen(request, timeout=60).read())[0]
        return {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": name}


@pytest.fixture(scope="module")
def stranger(tmp_path_factory, tiny_model_dir) -> Iterator[Stranger]:
    data_dir = tmp_path_factory.mktemp("public")
    shutil.copytree(tiny_model_dir, data_dir / "models" / "tiny")
    home = tmp_path_factory.mktemp("home")  # where `datasets` would put a cache outside the data folder
    old = dict(os.environ)
    os.environ["HOME"] = str(home)
    for name in ("XDG_CACHE_HOME", "HF_HOME", "HF_DATASETS_CACHE"):
        os.environ.pop(name, None)
    try:
        proc = start_app(data_dir, port := free_port(), "--public", "--auth", "alice:alicepw")
    finally:
        os.environ.clear()
        os.environ.update(old)
    try:
        yield Stranger(f"http://127.0.0.1:{port}/", proc.pid, data_dir)
    finally:
        stop_app(proc)
    assert not (home / ".cache" / "huggingface" / "datasets").exists(), "a cache outside the data folder"


def alias_bomb(depth: int) -> bytes:
    doc = 'learning_rate:\n  - &a0 ["x","x","x","x","x","x","x","x","x","x"]\n'
    for i in range(1, depth):
        doc += f"  - &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n"
    return doc.encode()


@pytest.mark.parametrize("name, content, message", [
    ("laughs.yaml", alias_bomb(7), "aliases (*name, <<: *name) are not accepted"),  # 10^7 leaves in 365 bytes
    ("deep.yaml", b"a: " + b"[" * 5000 + b"]" * 5000, "nested more than 8 levels deep"),
    ("digits.yaml", b"learning_rate: " + b"9" * 6000, "a number too long to read"),
    ("large.yaml", b"# " + b"x" * 70_000 + b"\nlearning_rate: 1e-5\n", "larger than 64 kB"),
])
def test_load_yaml_refuses_a_file_that_would_expand_at_no_cost(stranger, name, content, message):
    before = stranger.peak_mb()
    dependency = stranger.event_of("load-yaml", "upload")
    answer = stranger.send(dependency, [stranger.upload(name, content)])
    text = json.dumps(answer["output"]["data"])
    assert "Not loaded" in text and message in text, text[:500]
    assert stranger.peak_mb() - before < 50


def test_preview_reads_the_first_rows_of_a_parquet_file_that_expands_to_gigabytes(stranger, tmp_path):
    bomb = tmp_path / "prompts.parquet"
    rows = 2_000_000  # 50 kB compressed, about 400 MB as Arrow
    pq.write_table(pa.table({"prompt": ["What is 1+1? " * 15] * rows, "answer": ["2"] * rows}), bomb,
                   compression="zstd", row_group_size=rows)
    file = stranger.upload("prompts.parquet", bomb.read_bytes())
    dependency = stranger.event_of("preview-data", "click")
    data = stranger.inputs(dependency, field_dataset_source="file", field_file_path=file)
    stranger.send(dependency, data)  # the first preview imports what previews need
    before = stranger.peak_mb()
    answer = stranger.send(dependency, data)
    assert "Columns: `prompt`, `answer`" in json.dumps(answer["output"]["data"])
    assert stranger.peak_mb() - before < 50
    caches = [p for p in stranger.data_dir.rglob("*.arrow")]
    assert caches == []  # nothing converted, in the data folder or outside it (the fixture checks ~/.cache)


def test_the_rest_routes_refuse_and_send_callers_to_the_queue(stranger):
    for route, body in (("gradio_api/run/login", {"data": ["alice", "wrong"]}),
                        ("gradio_api/run/predict", {"data": [None, None], "fn_index": 0})):
        request = urllib.request.Request(stranger.url + route, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 404 and "join the queue" in refused.value.read().decode()
    # Through the queue, the API still answers.
    assert "limits" in Client(stranger.url, verbose=False).predict(api_name="/limits")


@pytest.mark.parametrize("api, arguments, message", [
    ("/completions", {"run_id": 1, "text": "a" * 60_000}, None),  # no run 1: refused before any query
    ("/status", {"run_id": 10**30}, "run_id must be a whole number from 0 to"),
    ("/metrics", {"run_id": 0, "after_id": 10**30}, "after_id must be a whole number from 0 to"),
    ("/completions", {"run_id": 0, "step": -1}, "step must be a whole number from 0 to"),
])
def test_an_anonymous_caller_reads_a_sentence_naming_the_argument_never_the_drivers_text(stranger, api, arguments,
                                                                                         message):
    with pytest.raises(AppError) as refused:
        Client(stranger.url, verbose=False).predict(**arguments, api_name=api)
    text = str(refused.value)
    assert "sqlite" not in text.lower() and "SELECT" not in text and "int too large" not in text
    assert message is None or message in text, text


def test_a_setting_out_of_the_maths_range_is_refused_before_the_run_is_stored(stranger):
    token = Client(stranger.url, verbose=False).predict(username="alice", password="alicepw", api_name="/login")
    alice = Client(stranger.url, verbose=False, headers={"x-a2po-token": token["token"]})
    spec = {"name": "eps", "method": "grpo", "model": str(stranger.data_dir / "models" / "tiny"), "peft": None,
            "dataset": {"source": "arithmetic", "num_prompts": 4, "eval_size": 2},
            "config": {"loss_type": "cispo", "epsilon_high": 1e308, "num_iterations": 2, "num_generations": 2,
                       "max_steps": 2, "per_device_train_batch_size": 2, "max_completion_length": 8}}
    with pytest.raises(AppError, match="epsilon_high must be from 0 to 10000"):
        alice.predict(spec=spec, api_name="/launch")
    assert Store(stranger.data_dir / "studio.db").list_runs() == []


def test_a_database_that_does_not_answer_is_a_plain_sentence_and_the_operators_log_has_the_rest(caplog):
    import sqlalchemy.exc

    def status(services, run_id):
        raise sqlalchemy.exc.OperationalError("SELECT runs.id FROM runs", {}, Exception(
            'connection to server on socket "/tmp/a2po-pg/socket/.s.PGSQL.5432" failed'))

    call = with_services(status, services=None)
    with caplog.at_level(logging.ERROR, logger="app.web.api"), pytest.raises(Exception) as answered:
        call(run_id=1)
    assert answered.value.message == ("/status: the studio's database did not answer (it may be restarting); try "
                                      "again in a moment.")
    assert ".s.PGSQL" in caplog.text  # for the operator only
    assert public_error("launch", OverflowError("Python int too large")).message == (
        "/launch could not answer: an error inside the studio, written to its log for the operator.")
