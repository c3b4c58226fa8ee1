"""Open-loop load from several client processes (loadgen `--clients N`).

One Python process with aiohttp tops out near a thousand requests/s of the bench body (making
JSON bodies and reading responses share one core with the event loop), which is what a 4-GPU
service must take. So the offered rate is split: each of N processes runs `send_schedule` at
rate/N from its own seed, all starting at one shared CLOCK_MONOTONIC time (asyncio's loop time is
`time.monotonic()`, the same clock in every process of the host). The union of N independent
Poisson streams of rate r/N is a Poisson stream of rate r; constant arrivals are interleaved by
shifting process k by k/r. Outcomes come back as plain tuples and are merged by scheduled time.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time

from tools.http_client import make_session, send_schedule
from tools.stats import Outcome
from tools.workload import RequestFactory, Workload, arrival_offsets

START_MARGIN_S = 2.0  # between fixing the shared start time and the first send


def _ready() -> bool:
    """Run in each child before the clock starts: importing this module there (spawn) has
    imported aiohttp and friends, so no child spends its first sends on imports."""
    return True


def _client(base_url: str, workload: Workload, offsets: list[float], seed: str, rate: float,
            timeout_s: float, start: float) -> list[tuple]:
    async def go() -> list[Outcome]:
        async with make_session() as session:
            factory = RequestFactory(workload, seed, rate)  # repeats stay within one client
            return await send_schedule(session, base_url, offsets, factory,
                                       timeout_s=timeout_s, start=start)

    return [(o.intended, o.sent, o.done, o.kind, o.stages) for o in asyncio.run(go())]


def run_processes(base_url: str, workload: Workload, rate: float, horizon_s: float, arrival: str,
                  seed: int | str, timeout_s: float, clients: int) -> list[Outcome]:
    """Offer `rate` requests/s for `horizon_s` from `clients` processes; every outcome, with times
    in seconds from the shared start, sorted by scheduled time (as `send_schedule` returns)."""
    ctx = multiprocessing.get_context("spawn")  # no forked event loop or sockets
    with ctx.Pool(clients) as pool:
        pool.starmap(_ready, [()] * clients)  # imports done before the clock starts
        start = time.monotonic() + START_MARGIN_S
        jobs = []
        for k in range(clients):
            offsets = arrival_offsets(arrival, rate / clients, horizon_s, f"{seed}:client{k}")
            if arrival == "constant":
                offsets = [t + k / rate for t in offsets if t + k / rate < horizon_s]
            jobs.append((base_url, workload, offsets, f"{seed}:client{k}", rate / clients,
                         timeout_s, start))
        merged = [Outcome(*row) for rows in pool.starmap(_client, jobs) for row in rows]
    merged.sort(key=lambda o: o.intended)
    return merged
