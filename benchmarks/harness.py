"""What the measurement harnesses and scripts/ share: `studio(...)`, a studio served by `python -m app` in a process
of its own, for driving it through its API, and `studio_page(url)`, a page of it in Debian's headless chromium."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Studio:
    url: str
    process: subprocess.Popen
    log: Path


@contextlib.contextmanager
def studio(data_dir: Path, *args: str, port: int | None = None, env: Mapping[str, str] | None = None,
           timeout: float = 180) -> Iterator[Studio]:
    """`python -m app` serving `data_dir` on 127.0.0.1:`port` (a free one when None) with more command-line `args`,
    and `env` added to the environment; yields once it answers HTTP, and stops it on leaving. Its output is appended
    to `<data_dir>/server.log`."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port() if port is None else port
    environ = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **(env or {}))
    # This checkout's packages first: the venv may hold an editable install of another one.
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)
    log = data_dir / "server.log"
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--data-dir", str(data_dir),
                                    *args], env=environ, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_served(process, f"http://127.0.0.1:{port}/", log, timeout)
        yield Studio(f"http://127.0.0.1:{port}/", process, log)
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_served(process: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"python -m app exited with code {process.returncode} before serving {url}; the end "
                               f"of {log}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"python -m app did not answer at {url} within {timeout:.0f} s (its output: {log}); a slow "
                       "machine may need a longer `timeout`.")


@contextlib.contextmanager
def studio_page(url: str, *, height: int = 900, timeout_ms: int = 60_000) -> Iterator[Any]:
    """A playwright page of the studio at `url` in Debian's headless chromium, once its tabs are drawn; the browser
    closes on leaving. `timeout_ms` bounds every wait, `expect`'s included."""
    import playwright.sync_api as playwright

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.set_default_timeout(timeout_ms)
            playwright.expect.set_options(timeout=timeout_ms)  # its own default is 5 s: too short on a busy machine
            page.goto(url, wait_until="load")
            page.wait_for_selector("#main-tabs")
            yield page
        finally:
            browser.close()
