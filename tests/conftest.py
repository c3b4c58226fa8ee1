"""Shared fixtures: the real Serve app, started once per test run with `serve run`."""

import os
import secrets

import httpx
import pytest

from tools.configs import shipped_yaml
from tools.random_model import make_random_model
from tools.service import FAST_METRICS_ENV, deployment, serving, small_model_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


# The ids of the shared service's API keys: tests/cpu/test_api_keys_http.py revokes
# "revoked-team"; "quota-team" alone has a quota, for tests/cpu/test_quotas_http.py.
KEY_IDS = ("team-a", "team-b", "revoked-team", "quota-team")
QUOTAS = {"quota-team": " rpm=1000 tpm=1000"}


@pytest.fixture(scope="session")
def api_keys(tmp_path_factory) -> dict[str, str]:
    """id -> key of the shared service; random per run, so a log can be searched for them."""
    return {key_id: f"rk-{key_id}-{secrets.token_urlsafe(24)}" for key_id in KEY_IDS}


@pytest.fixture(scope="session")
def api_keys_file(tmp_path_factory, api_keys):
    path = tmp_path_factory.mktemp("api-keys") / "keys"
    path.write_text("# id:key, one per calling team\n"
                    + "".join(f"{key_id}:{key}{QUOTAS.get(key_id, '')}\n"
                              for key_id, key in api_keys.items()))
    return path


@pytest.fixture(scope="session")
def auth_headers(api_keys) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_keys['team-a']}"}


@pytest.fixture(scope="session")
def served(api_keys_file):
    """configs/score.yaml served by `serve run`, with API keys on (auth.api_keys_file) and two
    ingress replicas (each must check keys); otherwise only the HTTP port is changed."""
    config = shipped_yaml("score.yaml")
    config["applications"][0]["args"]["auth"] = {"api_keys_file": str(api_keys_file)}
    ingress = deployment(config, "ScoreIngress")
    ingress.pop("autoscaling_config")
    ingress["num_replicas"] = 2
    with serving(config, FAST_METRICS_ENV) as service:  # metrics every second, not ten
        yield service


@pytest.fixture(scope="session")
def server_url(served):
    """Base URL of the shared service (`served`): every request but /health needs a key."""
    return served.url


@pytest.fixture(scope="session")
def client(server_url, auth_headers):
    """An httpx client of the shared service that sends team-a's key."""
    with httpx.Client(base_url=server_url, timeout=60, headers=auth_headers) as c:
        yield c


@pytest.fixture(scope="session")
def small_model(tmp_path_factory):
    """A fast random Llama with the default model's tokenizer, for load and fault tests."""
    return make_random_model(tmp_path_factory.mktemp("small-model"), "small")


@pytest.fixture(scope="module")
def small_server_url(small_model):
    """configs/score.yaml on the small random model, max_seq_tokens 1024 (tools/service.py),
    stopped after the module that uses it (no idle Ray instance beside the load tests):
    a request split into several sequences costs a fraction of a second here, where the real
    model needs 25-40 s of CPU for the 4,097 tokens that split under the shipped 4,096."""
    with serving(small_model_config(small_model)) as service:
        yield service.url


# Fixtures above that start the Serve app: a test using one is in the slow tier.
SERVICE_FIXTURES = {"served", "server_url", "client", "small_server_url"}


def pytest_collection_modifyitems(items):
    """Marks `service` every test that starts Ray: those using a service fixture here (the
    modules that start their own say so with `pytestmark`). `-m "not service"` is the fast tier."""
    for item in items:
        if SERVICE_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.service)
