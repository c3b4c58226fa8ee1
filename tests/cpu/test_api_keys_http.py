"""API keys over real HTTP: the shared service of tests/conftest.py (configs/score.yaml with
auth.api_keys_file and two ingress replicas). Everything but /health needs a key: the scoring
routes, /v1/models, /docs, /openapi.json and unknown routes. Checked with plain HTTP, curl, the
cohere SDK and LiteLLM; revocation by editing the file; no key in any log line or metric."""

import os
import subprocess

import cohere
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.service import by_replica, lines_containing
from tools.service import wait_until

QUERY, DOCS = "What is the capital of France?", ["Bananas are yellow.", "Paris is in France."]
SCORE = {"query": "Is it?", "items": ["yes"], "label_token_ids": [10539, 5230]}
WRONG_KEY = "rk-wrong-0123456789abcdefghij"
GUARDED = [("POST", "/v1/score"), ("POST", "/v1/rerank"), ("POST", "/v2/rerank"),
           ("GET", "/v1/models"), ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json"),
           ("GET", "/docs-assets/swagger-ui.css"), ("GET", "/no/such/route"),
           ("GET", "/v1/score")]
REFUSED_HEADERS = [{}, {"Authorization": f"Bearer {WRONG_KEY}"},
                   {"Authorization": f"Basic {WRONG_KEY}"}, {"Authorization": WRONG_KEY},
                   {"Authorization": "Bearer"}, {"X-API-Key": WRONG_KEY}]
HEADER_ILLEGAL = bytes([*range(0x09), *range(0x0a, 0x20), 0x7f])  # what h11 will not send
SEEN_KEYS: set[str] = set()  # every key string sent by this module, searched for in the logs


def bearer(key: str) -> dict[str, str]:
    SEEN_KEYS.add(key)
    return {"Authorization": f"Bearer {key}"}


def assert_refused(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert error["type"] == "AuthenticationError" and error["code"] == 401
    assert error["param"] is None and error["message"]
    assert WRONG_KEY not in r.text


@pytest.mark.parametrize("method, path", GUARDED)
def test_every_route_but_health_refuses_a_missing_or_wrong_key(server_url, method, path):
    SEEN_KEYS.add(WRONG_KEY)
    for headers in REFUSED_HEADERS:
        r = httpx.request(method, f"{server_url}{path}", json=SCORE, headers=headers, timeout=30)
        assert_refused(r)
    assert httpx.get(f"{server_url}/health", timeout=30).status_code == 200  # no key needed


def test_the_key_is_checked_before_the_body_is_read(server_url):
    too_large = b"x" * (17 * 1024 * 1024)  # over limits.max_body_bytes: 413 with a key
    assert_refused(httpx.post(f"{server_url}/v1/score", content=too_large, timeout=60))


def test_each_key_opens_every_route(server_url, api_keys):
    for key_id in ("team-a", "team-b"):
        headers = bearer(api_keys[key_id])
        with httpx.Client(base_url=server_url, headers=headers, timeout=60) as client:
            assert client.post("/v1/score", json=SCORE).status_code == 200
            assert client.post("/v2/rerank", json={"query": QUERY, "documents": DOCS}
                               ).status_code == 200
            assert client.get("/v1/models").json()["data"][0]["id"] == "smollm2-135m-instruct"
            assert client.get("/openapi.json").status_code == 200
            assert client.get("/docs").status_code == 200
            assert client.get("/no/such/route").json()["error"]["code"] == 404


def _curl(url: str, *args: str) -> str:
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *args, url],
                         capture_output=True, text=True, timeout=60)
    return out.stdout


def test_curl_with_and_without_the_key(server_url, api_keys):
    body = ["-H", "Content-Type: application/json", "-d",
            '{"query": "q", "documents": ["a", "b"]}']
    assert _curl(f"{server_url}/v1/rerank", *body) == "401"
    key = api_keys["team-b"]
    SEEN_KEYS.add(key)
    assert _curl(f"{server_url}/v1/rerank", "-H", f"Authorization: Bearer {key}", *body) == "200"
    assert _curl(f"{server_url}/v1/models", "-H", f"Authorization: Bearer {key}") == "200"


@pytest.mark.parametrize("client_class", [cohere.ClientV2, cohere.Client])
def test_cohere_sdk_with_and_without_the_key(server_url, api_keys, client_class):
    SEEN_KEYS.update((WRONG_KEY, api_keys["team-a"]))
    wrong = client_class(base_url=server_url, api_key=WRONG_KEY, timeout=60)
    with pytest.raises(cohere.errors.UnauthorizedError) as error:
        wrong.rerank(model="smollm2-135m-instruct", query=QUERY, documents=DOCS)
    assert error.value.status_code == 401
    right = client_class(base_url=server_url, api_key=api_keys["team-a"], timeout=60)
    out = right.rerank(model="smollm2-135m-instruct", query=QUERY, documents=DOCS)
    assert sorted(r.index for r in out.results) == [0, 1]


def test_litellm_rerank_with_and_without_the_key(server_url, api_keys):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    litellm = pytest.importorskip("litellm")
    SEEN_KEYS.update((WRONG_KEY, api_keys["team-b"]))
    call = dict(model="cohere/smollm2-135m-instruct", query=QUERY, documents=DOCS,
                api_base=server_url, num_retries=0)
    with pytest.raises(litellm.AuthenticationError):
        litellm.rerank(api_key=WRONG_KEY, **call)
    out = litellm.rerank(api_key=api_keys["team-b"], **call)
    assert sorted(r["index"] for r in out.results) == [0, 1]


@settings(max_examples=60, deadline=None, database=None, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(value=st.binary(max_size=80).map(lambda b: b.translate(None, HEADER_ILLEGAL).strip()))
def test_any_authorization_header_but_a_key_is_a_401(server_url, value):
    r = httpx.post(f"{server_url}/v1/score", json=SCORE, headers={"Authorization": value},
                   timeout=30)
    assert_refused(r)


def test_metrics_count_requests_by_key_id_and_never_show_a_key(served, api_keys):
    # Both ingress replicas declared every key id's series at 0 from start-up.
    declared = by_replica(served, "ray_ranker_requests_total", key="revoked-team")
    assert len(declared) == 2, declared
    wait_until(lambda: sum(by_replica(served, "ray_ranker_requests_total", key="team-a",
                                       route="/v1/score", status="200").values()) > 0
               and sum(by_replica(served, "ray_ranker_errors_total", key="-", status="401",
                                   error_type="AuthenticationError").values()) > 0,
               60, "team-a's 200s and the refused requests' 401s counted", served)
    text = httpx.get(served.metrics_url(), timeout=10).text
    assert not [key for key in api_keys.values() if key in text]
    assert WRONG_KEY not in text


def _all_refused(server_url: str, key: str, n: int) -> bool:
    statuses = {httpx.post(f"{server_url}/v1/score", json=SCORE, headers=bearer(key),
                           timeout=30).status_code for _ in range(n)}
    assert statuses <= {200, 401}, statuses
    return statuses == {401}


def _settled(read):
    """read() once two reads 2 s apart agree (metrics reach the endpoint about 1 s late)."""
    values = [read()]
    wait_until(lambda: values.append(read()) or values[-1] == values[-2], 60, "metrics settled",
               every_s=2)
    return values[-1]


def test_removing_a_key_from_the_file_revokes_it_on_every_replica(served, api_keys_file,
                                                                  api_keys):
    revoked = api_keys["revoked-team"]
    assert not _all_refused(served.url, revoked, 1)
    refused = lambda: by_replica(served, "ray_ranker_errors_total", key="-",  # noqa: E731
                                  route="/v1/score", status="401")
    before = _settled(refused)
    lines = api_keys_file.read_text().splitlines(keepends=True)
    api_keys_file.write_text("".join(line for line in lines
                                     if not line.startswith("revoked-team:")))
    # Each replica reads the file again at its next request a second after its last look:
    # wait until 20 requests in a row are refused, spread over both replicas by the proxy,
    # and both replicas have counted refusals since the file changed.
    wait_until(lambda: _all_refused(served.url, revoked, 20), 30, "the key refused", served)
    wait_until(lambda: _all_refused(served.url, revoked, 4) and len(refused()) == 2
               and all(n > before.get(replica, 0) for replica, n in refused().items()),
               60, "refusals counted on both ingress replicas", served)
    headers = bearer(api_keys["team-a"])
    assert httpx.post(f"{served.url}/v1/score", json=SCORE, headers=headers,
                      timeout=30).status_code == 200


def test_no_key_is_in_any_log_line(served, api_keys):
    # Last in this module: after right, wrong and revoked keys were sent in every client's way
    # (quota-team's key is tests/cpu/test_quotas_http.py's, searched for there as well).
    assert SEEN_KEYS >= {WRONG_KEY, *(api_keys[k] for k in ("team-a", "team-b", "revoked-team"))}
    assert lines_containing(served, ["ScoreIngress"])  # the search does read the logs
    assert lines_containing(served, sorted(SEEN_KEYS | set(api_keys.values()))) == []
