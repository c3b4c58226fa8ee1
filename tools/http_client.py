"""The open-loop HTTP sender shared by the load tools: one session, one POST, a schedule of POSTs.

Open loop: each request is sent at its time whatever the state of earlier ones; a response is
never awaited before the next send. Used by tools/loadgen.py, tools/ramp.py and the
client processes of tools/client_pool.py.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
from tqdm import tqdm

from tools.stats import OK, Outcome, parse_server_timing
from tools.workload import RequestFactory

JSON_HEADERS = {"Content-Type": "application/json"}
# The API key the load tools send when the service wants one (docs/ARCHITECTURE.md, "API keys"):
# from the environment, not the command line, where `ps` would show it.
API_KEY_ENV = "RANKER_API_KEY"


def make_session(headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """One shared session; no cap on concurrent connections (open loop). Every request carries
    `headers` and, when $RANKER_API_KEY is set, `Authorization: Bearer` with that key."""
    key = os.environ.get(API_KEY_ENV)
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 headers={**auth, **(headers or {})})


async def send_one(session: aiohttp.ClientSession, url: str, body: bytes, n_items: int,
                   timeout_s: float, result_key: str = "scores"
                   ) -> tuple[str, dict[str, float] | None]:
    """POST one body; returns "ok" or the failure kind (status code, "timeout", ...), and the
    response's Server-Timing stages (None without a response or header)."""
    stages = None
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            payload = await resp.read()
            stages = parse_server_timing(resp.headers.get("Server-Timing"))
            if resp.status != 200:
                return str(resp.status), stages
            doc = json.loads(payload)
            scores = doc.get(result_key) if isinstance(doc, dict) else None
            ok = isinstance(scores, list) and len(scores) == n_items
            return (OK if ok else "bad_response"), stages
    except TimeoutError:  # before OSError: TimeoutError is one (and aiohttp's timeouts are too)
        return "timeout", stages
    except (aiohttp.ClientConnectionError, OSError):
        return "connection", stages
    except aiohttp.ClientError:
        return "client_error", stages
    except ValueError:  # undecodable JSON
        return "bad_response", stages


async def send_schedule(session: aiohttp.ClientSession, base_url: str, offsets: list[float],
                        factory: RequestFactory, *, timeout_s: float, start: float | None = None,
                        desc: str = "", progress: bool = False) -> list[Outcome]:
    """Open loop: one request from `factory` at each offset (seconds after `start`, a loop time;
    default now), never waiting for earlier responses. Returns every outcome by scheduled time."""
    url = base_url.rstrip("/") + factory.workload.path
    n_items, key = factory.workload.items, factory.workload.result_key
    loop = asyncio.get_running_loop()
    outcomes: list[Outcome] = []
    failed = 0
    bar = tqdm(total=len(offsets), desc=desc, unit="req", disable=not progress, leave=False,
               dynamic_ncols=True)

    async def one(intended: float, body: bytes) -> None:
        nonlocal failed
        sent = loop.time() - t0
        kind, stages = await send_one(session, url, body, n_items, timeout_s, key)
        outcomes.append(Outcome(intended, sent, loop.time() - t0, kind, stages))
        failed += kind != OK
        bar.update(1)
        if kind != OK or len(outcomes) % 25 == 0:
            bar.set_postfix(inflight=len(tasks), failed=failed, refresh=False)

    tasks: set[asyncio.Task] = set()
    body = factory.next_bytes() if offsets else b""
    t0 = loop.time() if start is None else start
    try:
        for i, offset in enumerate(offsets):
            await asyncio.sleep(max(0.0, t0 + offset - loop.time()))
            task = asyncio.create_task(one(offset, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(0)  # let it start sending before the next body is made
            if i + 1 < len(offsets):
                body = factory.next_bytes()  # made while waiting for the next send time
        await asyncio.gather(*tasks)
    finally:
        bar.close()
    outcomes.sort(key=lambda o: o.intended)
    return outcomes
