"""Per-key quotas over real HTTP: the shared service of tests/conftest.py (two ingress replicas;
"quota-team" has `rpm=1000 tpm=1000` beside its key). Traffic at 3× the token quota for most
of a minute, spread by the proxy over both ingress replicas, one of which is killed and
replaced midway: the minute serves the quota and no more, the rest is a 429 with Retry-After,
/v1/usage tells the key what is left, other keys are untouched; the Cohere SDK and LiteLLM see
the 429 as docs/OPERATIONS.md ("Quotas") says."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import cohere
import httpx
import pytest

from tests.conftest import QUOTAS
from tests.support.service import by_replica, lines_containing, replica_processes
from tools.prom import scrape
from tools.service import wait_until

TOKENS_PER_MINUTE = 1000
REQUESTS_PER_MINUTE = 1000
assert QUOTAS["quota-team"] == f" rpm={REQUESTS_PER_MINUTE} tpm={TOKENS_PER_MINUTE}"
SCORE = {"query": "Which of these is a fruit?", "items": ["an apple", "a chair"],
         "label_token_ids": [10539, 5230]}
MINUTE_S = 60


def _post(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json=SCORE, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


def _send_at(url: str, key: str, rate: float, until: float, sent: list) -> None:
    """Requests at `rate` a second until `until` (monotonic), each answer kept as
    (time sent, status, headers, body)."""
    with ThreadPoolExecutor(8) as pool:
        futures, start = [], time.monotonic()
        while (now := time.monotonic()) < until:
            futures.append((now, pool.submit(_post, url, key)))
            time.sleep(max(0.0, start + len(futures) / rate - time.monotonic()))
        for at, future in futures:
            r = future.result()
            sent.append((at, r.status_code, r.headers, r.json()))


def test_a_token_quota_serves_its_minute_across_replicas_and_a_restart(served, api_keys):
    url, key = served.url, api_keys["quota-team"]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    import litellm  # seconds to import: before the minute starts
    # What one request costs, as the response's usage says (a key without a quota).
    probe = _post(url, api_keys["team-a"])
    assert probe.status_code == 200
    tokens = probe.json()["usage"]["prompt_tokens"]
    allowed = TOKENS_PER_MINUTE // tokens  # requests that fit in the minute
    assert 10 <= allowed <= 100, tokens
    rate = 3 * allowed / MINUTE_S  # 3× the quota
    assert len(replica_processes(served, "ScoreIngress")) == 2

    started = time.monotonic()
    sent: list = []
    # Until the quota is spent and a little past it: about a third of the minute.
    _send_at(url, key, rate, started + MINUTE_S / 3 + 4, sent)
    assert sum(1 for s in sent if s[1] == 200) == allowed, [s[1] for s in sent]
    items = lambda: by_replica(served, "ray_ranker_key_items_total", key="quota-team")  # noqa: E731
    wait_until(lambda: len(items()) == 2 and sum(items().values()) == 2 * allowed, 60,
               "both ingress replicas served quota-team (2 items a request)", served)

    # Clients, while the key is still over its quota: Cohere's SDK raises its
    # TooManyRequestsError (it would wait Retry-After and retry with max_retries > 0).
    client = cohere.ClientV2(base_url=url, api_key=key, timeout=60)
    with pytest.raises(cohere.errors.TooManyRequestsError) as error:
        client.rerank(model="smollm2-135m-instruct", query="q", documents=["a", "b"],
                      request_options={"max_retries": 0})
    assert error.value.status_code == 429
    with pytest.raises(litellm.RateLimitError):
        litellm.rerank(model="cohere/smollm2-135m-instruct", query="q", documents=["a", "b"],
                       api_base=url, api_key=key, num_retries=0)

    victim = replica_processes(served, "ScoreIngress")[0]
    victim.kill()
    wait_until(lambda: not victim.is_running()
               and len(replica_processes(served, "ScoreIngress")) == 2
               and httpx.get(f"{url}/health", timeout=10).status_code == 200, 40,
               "the killed ingress replica replaced", served)
    restarted = time.monotonic()
    # The rest of the minute since the first request: still at 3× the quota, still refused.
    assert restarted < started + MINUTE_S - 14, "the restart took most of the quota's minute"
    _send_at(url, key, rate, started + MINUTE_S - 8, sent)

    statuses = [s[1] for s in sent]
    assert set(statuses) == {200, 429}, statuses
    served_tokens = statuses.count(200) * tokens
    assert statuses.count(200) == allowed  # none after the restart
    assert TOKENS_PER_MINUTE * 0.95 <= served_tokens <= TOKENS_PER_MINUTE
    for _, status, headers, body in sent:
        if status == 429:
            assert 1 <= int(headers["retry-after"]) <= MINUTE_S
            assert int(headers["retry-after-ms"]) >= 1
            assert body["error"]["type"] == "RateLimitError"
            assert body["error"]["param"] == "tokens_per_minute"
            assert "quota-team" in body["error"]["message"]

    usage = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {key}"},
                      timeout=30).json()
    assert usage["key"] == "quota-team"
    assert usage["tokens_per_minute"]["limit"] == TOKENS_PER_MINUTE
    assert usage["tokens_per_minute"]["remaining"] == TOKENS_PER_MINUTE - served_tokens
    assert usage["requests_per_minute"]["remaining"] == REQUESTS_PER_MINUTE - allowed
    free = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {api_keys['team-b']}"},
                     timeout=30).json()
    assert free == {"object": "usage", "key": "team-b", "requests_per_minute": None,
                    "tokens_per_minute": None}
    assert _post(url, api_keys["team-b"]).status_code == 200  # other keys are not refused

    # Refusals counted per key; the key itself in no metric and no log line.
    wait_until(lambda: sum(v for n, labels, v in scrape(served.metrics_url())
                           if n == "ray_ranker_errors_total" and labels.get("key") == "quota-team"
                           and labels.get("error_type") == "RateLimitError") > 0, 60,
               "429s counted for quota-team", served)
    assert key not in httpx.get(served.metrics_url(), timeout=10).text
    assert lines_containing(served, [key]) == []
