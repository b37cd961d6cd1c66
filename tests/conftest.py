"""Shared fixtures: offline environment and a tiny random-init model saved once per session."""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from a2po.testing import make_tiny_model  # noqa: E402

SLOW_ROOMS = {"browser", "runtime"}  # every test there starts a studio, a worker or a browser


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_ROOMS & set(item.path.parts[-3:-1]):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Llama-shaped model with a character tokenizer, as a local path usable as a model id."""
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_model(path)
    return str(path)


@pytest.fixture(scope="module")
def browser():
    """A headless chromium for a module's browser tests (`tests.browser`)."""
    from tests.browser import chromium

    with chromium() as browser:
        yield browser


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of the session's own (`tests.postgres`), stopped at its end."""
    from tests import postgres

    binaries = postgres.find_binaries()
    problem = postgres.MISSING if binaries is None else None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        problem = "psycopg is not installed: pip install -e '.[dev,cluster]' (which `make test` does)."
    if problem:
        if postgres.required():
            pytest.fail(f"A2PO_REQUIRE_POSTGRES is set but {problem}", pytrace=False)
        pytest.skip(problem)
    server = postgres.PostgresServer(binaries).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """Where a test's store lives: a new SQLite file, or a new database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        yield str(tmp_path / "studio.db")
        return
    server = request.getfixturevalue("postgres_server")
    url = server.create_database()
    yield url
    server.drop_database(url)


RAY_DASHBOARD = "http://127.0.0.1:8265"


def ray_bin() -> Path:
    return Path(sys.executable).parent / "ray"


def ray_answers() -> bool:
    """Whether the test cluster's dashboard (its Jobs API) answers."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{RAY_DASHBOARD}/api/version", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start_ray_head() -> None:
    """Start the one-node test cluster (2 CPUs, a 200 MB object store) and wait until its Jobs API answers."""
    import subprocess

    from tests.helpers import wait_for

    subprocess.run([str(ray_bin()), "start", "--head", "--port=6379", "--dashboard-host=127.0.0.1",
                    "--dashboard-port=8265", "--num-cpus=2", "--include-dashboard=true",
                    "--object-store-memory=200000000", "--disable-usage-stats"],
                   check=True, capture_output=True, timeout=180)
    wait_for(ray_answers, 60, "Ray's dashboard to answer")


def stop_ray_head() -> None:
    import subprocess

    subprocess.run([str(ray_bin()), "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def ray_cluster():
    """A one-node Ray cluster on 127.0.0.1 (dashboard, Jobs API at `RAY_DASHBOARD`): the one already running, or one
    started here and stopped at the session's end."""
    if not ray_bin().exists():
        problem = "Ray is not installed: pip install -e '.[dev,cluster]' (which `make test` does)."
        if os.environ.get("A2PO_REQUIRE_RAY", "") not in ("", "0"):
            pytest.fail(f"A2PO_REQUIRE_RAY is set but {problem}", pytrace=False)
        pytest.skip(problem)
    started = not ray_answers()
    if started:
        start_ray_head()
    yield RAY_DASHBOARD
    if started:
        stop_ray_head()
