"""Where a load test's host CPU goes: the whole host's busy share and, per group of processes
(Serve replicas by deployment, the load generator's clients, the rest), their CPU in cores,
sampled in a process of its own while a run lasts, so that sampling takes no time from the
process that measures latency (loadtest/bench_priority.py: does a flood starve the replicas of
CPU?).

    with HostCpu() as cpu:
        ...  # the run
    cpu.summary()  # {"host_busy_percent": {...}, "cores_by_group": {group: {...}}}
"""

from __future__ import annotations

import multiprocessing
import re
from multiprocessing.connection import Connection

import psutil

from tools.stats import percentile

INTERVAL_S = 0.5
# Ray names a Serve replica's process "ray::ServeReplica:APP:DEPLOYMENT"
_REPLICA = re.compile(r"ServeReplica:[^:]+:(\w+)")


def group_of(process: psutil.Process) -> str:
    """A process's group: its Serve deployment, `proxy`, `client` (tools/client_pool.py) or
    `other`."""
    try:
        text = " ".join([process.name(), *process.cmdline()])
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    if match := _REPLICA.search(text):
        return match[1]
    if "ProxyActor" in text or "proxy" in process.name().lower():
        return "proxy"
    if "client_pool" in text:
        return "client"
    return "other"


class HostCpu:
    """Samples every INTERVAL_S from __enter__ to __exit__ (in a child process)."""

    def __init__(self) -> None:
        self._summary: dict | None = None
        context = multiprocessing.get_context("spawn")  # nothing of this process's threads
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_sample, args=(child,), name="host-cpu",
                                        daemon=True)

    def __enter__(self) -> HostCpu:
        self._process.start()
        self._conn.recv()  # sampling has begun
        return self

    def __exit__(self, *exc) -> None:
        self._conn.send("stop")
        self._summary = self._conn.recv()
        self._process.join()

    def summary(self) -> dict:
        """p50 / p99 / max / mean of the host's busy percent and of each group's cores."""
        if self._summary is None:
            raise RuntimeError("summary() is the sampling's result: read it after the with")
        return self._summary


def _sample(conn: Connection) -> None:
    host: list[float] = []  # busy percent of all cores, per sample
    groups: dict[str, list[float]] = {}  # cores used per sample
    known: dict[int, tuple[psutil.Process, str]] = {}
    psutil.cpu_percent(None)  # the first call only starts the count
    conn.send("started")
    while not conn.poll(INTERVAL_S):
        host.append(psutil.cpu_percent(None))
        used: dict[str, float] = {}
        for process in psutil.process_iter():
            if process.pid not in known:
                process.cpu_percent(None)  # starts its count: read from the next sample
                known[process.pid] = (process, group_of(process))
                continue
            seen, group = known[process.pid]
            try:
                used[group] = used.get(group, 0.0) + seen.cpu_percent(None) / 100
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                del known[process.pid]
        for group, cores in used.items():
            groups.setdefault(group, []).append(cores)
    conn.send({"samples": len(host), "interval_s": INTERVAL_S,
               "host_busy_percent": _spread(host),
               "cores_by_group": {group: _spread(values)
                                  for group, values in sorted(groups.items())}})


def _spread(values: list[float]) -> dict:
    ranked = sorted(values)
    if not ranked:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    return {"p50": round(percentile(ranked, 50), 2), "p99": round(percentile(ranked, 99), 2),
            "max": round(ranked[-1], 2), "mean": round(sum(ranked) / len(ranked), 2)}
