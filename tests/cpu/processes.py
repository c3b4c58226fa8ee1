"""Stopping the processes a test started, exactly those (never `ray stop`, which stops every Ray
node of the machine, other people's included)."""

from __future__ import annotations

import psutil


def kill_all(procs: list[psutil.Process], timeout_s: float = 30) -> None:
    """SIGKILL each of `procs` (gone ones are skipped) and wait until they have exited."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout_s)
