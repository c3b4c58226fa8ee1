"""tools/host_cpu.py: a process's group by its name, and the CPU a busy process used, counted
in its group."""

import subprocess
import sys
import time

from tools.host_cpu import HostCpu, group_of


class _Process:
    def __init__(self, name: str, cmdline: list[str]) -> None:
        self._name, self._cmdline = name, cmdline

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return self._cmdline


def test_a_process_is_grouped_by_its_serve_deployment_or_role():
    assert group_of(_Process("ray::ServeReplica:score:ScoreWorker", [])) == "ScoreWorker"
    assert group_of(_Process("ray::ServeReplica:score:ScoreIngress", [])) == "ScoreIngress"
    assert group_of(_Process("ray::ProxyActor", [])) == "proxy"
    assert group_of(_Process("python3", ["python3", "-m", "tools.client_pool"])) == "client"
    assert group_of(_Process("python3", ["python3", "-m", "pytest"])) == "other"


def test_a_busy_process_is_counted_in_its_group():
    spin = "import time\nend = time.time() + 4\nwhile time.time() < end: pass"
    with HostCpu() as cpu:
        busy = subprocess.Popen([sys.executable, "-c", spin, "client_pool"])
        busy.wait(timeout=60)
        time.sleep(1.2)  # a sample after it ended
    summary = cpu.summary()
    assert summary["samples"] >= 4
    # a whole core when it has one; a share of one on a busy 2-core machine
    assert summary["cores_by_group"]["client"]["max"] >= 0.25
    assert summary["host_busy_percent"]["max"] > 0
