"""Shared fixtures: the real Serve app, started once per test run with `serve run`."""

import os

import httpx
import pytest

from loadtest.configs import shipped_yaml
from loadtest.random_model import make_random_model
from loadtest.service import small_model_config, start_service, stop_service

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def server_url():
    """Base URL of configs/score.yaml served by `serve run` (only the HTTP port is changed)."""
    service = start_service(shipped_yaml("score.yaml"))
    try:
        yield service.url
    finally:
        stop_service(service)


@pytest.fixture(scope="session")
def client(server_url):
    with httpx.Client(base_url=server_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def small_model(tmp_path_factory):
    """A fast random Llama with the default model's tokenizer, for load and fault tests."""
    return make_random_model(tmp_path_factory.mktemp("small-model"), "small")


@pytest.fixture(scope="module")
def small_server_url(small_model):
    """configs/score.yaml on the small random model, max_seq_tokens 1024 (loadtest/service.py),
    stopped after the module that uses it (no idle Ray instance beside the load tests):
    a request split into several sequences costs a fraction of a second here, where the real
    model needs 25-40 s of CPU for the 4,097 tokens that split under the shipped 4,096."""
    service = start_service(small_model_config(small_model))
    try:
        yield service.url
    finally:
        stop_service(service)


# Fixtures above that start the Serve app: a test using one is in the slow tier.
SERVICE_FIXTURES = {"server_url", "client", "small_server_url"}


def pytest_collection_modifyitems(items):
    """Marks `service` every test that starts Ray: those using a service fixture here (the
    modules that start their own say so with `pytestmark`). `-m "not service"` is the fast tier."""
    for item in items:
        if SERVICE_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.service)
