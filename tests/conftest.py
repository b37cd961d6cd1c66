"""Shared fixtures: offline environment and a tiny random-init model saved once per session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from a2po.testing import make_tiny_model  # noqa: E402


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
