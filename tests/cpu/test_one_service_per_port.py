"""One service per port (docs/OPERATIONS.md, "Ports"): a second `serve run` of configs/score.yaml
on the port of a running service fails at start, naming the port, and the running service keeps
answering every request, while the second starts and after it has gone. Without it, both Ray
clusters' Serve proxies would bind the port (SO_REUSEPORT) and the kernel would split the
connections between the two apps.

The first service is the shared one (tests/conftest.py, `served`), so this test starts only the
second, which fails.
"""

from __future__ import annotations

import httpx
import pytest

from tools.configs import shipped_yaml
from tools.service import launch_service, stop_service, wait_until

pytestmark = pytest.mark.service  # starts Ray

# Generous: the second's Ray starts (most of it) before its proxy tries the port.
SECOND_EXIT_DEADLINE_S = 180
REQUESTS_AFTER = 20
SCORE = {"query": "Q: Is Tokyo the capital of Japan?\nA:", "items": [" Yes", " No"],
         "label_token_ids": [9230, 2838], "apply_softmax": True}


def test_a_second_service_on_the_port_fails_and_the_first_keeps_every_request(served,
                                                                               auth_headers):
    def scores() -> list[list[float]]:
        # A new connection per request: the kernel spreads connections, not requests, over the
        # sockets that share a port.
        r = httpx.post(f"{served.url}/v1/score", json=SCORE, headers=auth_headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["scores"]

    first = scores()
    port = int(served.url.rsplit(":", 1)[1])
    second = launch_service(shipped_yaml("score.yaml"), port)
    try:
        def second_exited() -> bool:
            # The first's scores all along (the same bits each time: docs/OPERATIONS.md,
            # "Deterministic scores").
            assert scores() == first
            return second.proc.poll() is not None

        wait_until(second_exited, SECOND_EXIT_DEADLINE_S, "second serve run exited", second)
    finally:
        stop_service(second)
    assert second.proc.returncode != 0, second.log[-4000:]
    assert f"Failed to bind to address '127.0.0.1:{port}'" in second.log, second.log[-4000:]
    for _ in range(REQUESTS_AFTER):
        assert scores() == first
