"""The studio as an MCP server (`python -m app --mcp`), driven by the `mcp` Python client as an agent would: the tools
are the named API and nothing else, an anonymous caller on a `--public` studio only reads, and a signed-in one
launches "A*-PO vs GRPO", waits for it through the status tool and reads the study's verdict and completions.

A real `python -m app` process on a free port, its SQLite file in a temporary data folder, real workers training the
tiny random-init model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gradio_client import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from app.web import api
from tests.helpers import wait_for
from tests.web.test_app_api import free_port, start_app, stop_app, tiny_spec

pytestmark = pytest.mark.slow  # starts a studio, a worker or a command-line process


ROOT = Path(__file__).resolve().parents[2]
TOOLS = {endpoint.__name__ for endpoint, _ in api.ENDPOINTS} | {"upload_dataset"}


class Refused(Exception):
    """A tool call the studio answered with an error (the MCP result's `isError`)."""


class Agent:
    """An MCP client of the studio at `url`, sending `headers` with every request (a login's token)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url, self.headers = url + "gradio_api/mcp/", headers or {}

    async def _session(self, work):
        async with streamablehttp_client(self.url, headers=self.headers, timeout=120) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)

    def tools(self) -> list[Any]:
        async def work(session):
            return (await session.list_tools()).tools
        return asyncio.run(self._session(work))

    def call(self, tool: str, **arguments: Any) -> Any:
        """The tool's answer as JSON; an error result raises `Refused` with its text."""
        async def work(session):
            return await session.call_tool(tool, arguments)
        result = asyncio.run(self._session(work))
        text = "\n".join(part.text for part in result.content if getattr(part, "type", "") == "text")
        if result.isError:
            raise Refused(text)
        return json.loads(text)


@pytest.fixture(scope="module")
def studio(tmp_path_factory, tiny_model_dir) -> Iterator[str]:
    """A public studio with one password user, serving MCP."""
    data_dir = tmp_path_factory.mktemp("studio")
    port = free_port()
    proc = start_app(data_dir, port, "--mcp", "--public", "--auth", "alice:wonderland", "--model-root",
                     tiny_model_dir, timeout=180)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_app(proc)


def test_the_mcp_flag_and_its_space_default(monkeypatch):
    from app.__main__ import parse_args, serve_mcp

    monkeypatch.delenv("OAUTH_CLIENT_ID", raising=False)  # a Space's sign-in would be on by itself

    assert serve_mcp(parse_args(["--mcp"])) and not serve_mcp(parse_args(["--no-mcp"]))
    assert serve_mcp(parse_args(["--hf-oauth"])) and not serve_mcp(parse_args(["--hf-oauth", "--no-mcp"]))
    assert not serve_mcp(parse_args(["--auth", "alice:wonderland"]))  # off unless asked, off a Space


def test_mcp_without_its_package_is_refused_before_anything_is_touched(tmp_path):
    """Gradio would print the import error and serve without the endpoint; the studio refuses the flag instead."""
    data_dir = tmp_path / "never-made"
    hidden = "import sys; sys.modules['mcp'] = None; from app.__main__ import main; main(sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", hidden, "--mcp", "--data-dir", str(data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0 and "--mcp needs the `mcp` package" in done.stderr
    assert not data_dir.exists()


def documented_tools() -> dict[str, str]:
    """The tool table of docs/api.md's "Agents (MCP)" section: name -> its line."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("## Agents (MCP)", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", section, flags=re.MULTILINE))


def test_the_tools_are_the_named_api_with_readable_descriptions(studio):
    tools = {tool.name: tool for tool in Agent(studio).tools()}
    assert set(tools) == TOOLS  # no page event (an unnamed /lambda_N) among them
    assert set(documented_tools()) == TOOLS
    for tool in tools.values():
        assert len(tool.description) > 40, tool.name
    launch = tools["launch"].inputSchema["properties"]
    assert "preset" in launch["spec"]["description"] and "seeds" in launch
    assert tools["status"].inputSchema["properties"]["run_id"]["type"] == "number" or \
        "integer" in json.dumps(tools["status"].inputSchema["properties"]["run_id"])
    # The HTTP API lists the same names: the page's own events are private.
    named = Client(studio, verbose=False).view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert set(named) == {f"/{name}" for name in TOOLS}


def test_an_anonymous_agent_reads_but_may_not_launch(studio, tiny_model_dir):
    anonymous = Agent(studio)
    limits = anonymous.call("limits")
    assert limits["public"] and limits["login_required"] and "quick-look" in limits["presets"]
    with pytest.raises(Refused, match="needs a login"):
        anonymous.call("launch", spec=tiny_spec(tiny_model_dir, "anonymous"))
    with pytest.raises(Refused, match="needs a login"):
        anonymous.call("launch_pair", spec=tiny_spec(tiny_model_dir, "anonymous-pair"))
    assert anonymous.call("list_runs") == []


def test_a_forbidden_spec_field_is_refused_by_name(studio, tiny_model_dir):
    token = Agent(studio).call("login", username="alice", password="wonderland")["token"]
    alice = Agent(studio, {"x-a2po-token": token})
    with pytest.raises(Refused, match="output_dir"):
        alice.call("launch", spec=tiny_spec(tiny_model_dir, "forbidden", output_dir="/tmp/elsewhere"))
    with pytest.raises(Refused, match="No run #999"):
        alice.call("status", run_id=999)
    with pytest.raises(Refused, match="Wrong user name or password"):
        Agent(studio).call("login", username="alice", password="wrong")


def test_an_agent_runs_a2po_against_grpo_and_reads_the_verdict(studio, tiny_model_dir):
    token = Agent(studio).call("login", username="alice", password="wonderland")["token"]
    alice = Agent(studio, {"Authorization": f"Bearer {token}"})
    pair = alice.call("launch_pair", spec=tiny_spec(tiny_model_dir, "agent-pair", num_value_samples=2),
                      protocol="paper")
    ids = [pair["a2po"]["run_id"], pair["grpo"]["run_id"]]
    assert {s["id"] for s in alice.call("study")["studies"]} == {pair["study"]}

    def ended() -> bool:
        return all(not alice.call("status", run_id=run_id)["active"] for run_id in ids)

    wait_for(ended, timeout=600, poll=2, what="the pair to finish")
    for run_id in ids:
        status = alice.call("status", run_id=run_id)
        assert status["status"] == "finished", status["error"]
        assert status["owner"] == "alice" and "eval_accuracy" in status["latest_metrics"]

    read = alice.call("study", study_id=pair["study"])
    assert read["kind"] == "pair" and read["active"] == [] and {r["run_id"] for r in read["runs"]} == set(ids)
    assert read["verdict"] and "GRPO" in read["verdict"] and "\\*" not in read["verdict"]
    assert {row["method"] for row in read["figures"]} == {"A*-PO", "GRPO"}
    assert alice.call("compare", run_ids=ids)["verdict"] == read["verdict"]

    written = alice.call("completions", run_id=ids[1], limit=5)
    assert written["steps"] and 0 < len(written["rows"]) <= 5
    assert {"prompt_text", "completion", "reward", "advantage"} <= set(written["rows"][0])
    assert all(row["step"] == written["steps"][0] for row in
               alice.call("completions", run_id=ids[1], step=written["steps"][0])["rows"])
    with pytest.raises(Refused, match="needs a login"):  # the gate of the page: an anonymous agent only reads
        Agent(studio).call("delete", run_id=ids[0])
    assert alice.call("status", run_id=ids[0])["status"] == "finished"
