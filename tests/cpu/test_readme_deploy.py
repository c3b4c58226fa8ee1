"""The README's "Deploy on a Ray cluster" block, run as printed on two local Ray nodes with token
authentication on: the head, a scorer node offering the `scorer` resource, `serve deploy` of the
config `ranker_app.cluster_config` writes, `serve status`, and a call to the head's address that
is not 127.0.0.1. The commands are read from README.md, so the two cannot drift apart.

What the test changes, and only that: the fixed ports (6379, 8265, 8000) become free ones, and
each `ray start` gets free ports for what it would otherwise take by default and a temp dir of its
own (RAY_TMPDIR), so the nodes run beside other Ray clusters of this machine; HOME is a fresh
folder, so the token Ray writes (~/.ray/auth_token) is never the user's. Its nodes are stopped by
killing exactly their processes (never `ray stop`, which stops every Ray node of the machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.cpu.processes import kill_all
from tools.service import free_port

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEALTHY_TIMEOUT_S = 300
COMMAND_TIMEOUT_S = 180
SECTIONS = ("# on the head node", "# on each scorer node", "# from any machine")


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Deploy on a Ray cluster"):]
    return re.search(r"```bash\n(.*?)```", section, re.S)[1]


def commands_by_section(block: str) -> list[list[str]]:
    """The block's commands (continuation lines joined, comments dropped) under each of
    SECTIONS, in order."""
    sections: list[list[str]] = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith(SECTIONS):
            sections.append([])
        command = line.split(" # ")[0].split("   #")[0].strip()
        if command and not command.startswith("#"):
            sections[-1].append(command)
    assert len(sections) == len(SECTIONS), block
    return sections


def non_loopback_ip() -> str:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    pytest.fail("this machine has no IPv4 address besides loopback to call the head at")


class ReadmeCluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rd", dir="/tmp"))  # short: unix socket paths
        (self.root / "home").mkdir()
        self.ports = {"6379": free_port(), "8265": free_port(), "8000": free_port()}
        env = {k: v for k, v in os.environ.items()
               if k != "RAY_ADDRESS" and not k.startswith("RAY_AUTH")}
        self.env = {**env, "PATH": f"{BIN}:{env['PATH']}", "HOME": str(self.root / "home"),
                    "RAY_USAGE_STATS_ENABLED": "0", "HEAD_IP": non_loopback_ip()}
        self.log: list[str] = []

    def adapt(self, command: str) -> str:
        for fixed, port in self.ports.items():
            command = command.replace(fixed, str(port))
        if command.startswith("ray start"):
            command += (f" --metrics-export-port={free_port()}"
                        f" --dashboard-agent-listen-port={free_port()}")
            if "--head" in command:
                command += f" --ray-client-server-port={free_port()}"
        return command

    def run(self, exports: list[str], command: str, node: str) -> subprocess.CompletedProcess:
        script = "; ".join([*exports, self.adapt(command)])
        out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                             env={**self.env, "RAY_TMPDIR": str(self.root / node)},
                             timeout=COMMAND_TIMEOUT_S)
        self.log.append(f"$ {script}\n[{out.returncode}] {out.stdout[-2000:]}{out.stderr[-2000:]}")
        return out

    def processes(self) -> list[psutil.Process]:
        """Every process of this test's nodes: those started with its RAY_TMPDIR, and what they
        started (Ray's agents rename themselves, which can hide their environment)."""
        ours: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("RAY_TMPDIR", "").startswith(str(self.root)):
                    for p in (proc, *proc.children(recursive=True)):
                        ours[p.pid] = p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return list(ours.values())

    def close(self) -> list[int]:
        kill_all(self.processes())
        shutil.rmtree(self.root, ignore_errors=True)
        return [p.pid for p in self.processes()]


def deployment_states(status_stdout: str) -> dict[str, str]:
    status = yaml.safe_load(status_stdout) or {}
    app = status.get("applications", {}).get("score", {})
    return {name: d.get("status") for name, d in app.get("deployments", {}).items()}


def test_the_readme_deploy_block_runs_as_printed():
    head, scorer, client = commands_by_section(readme_block())
    written = REPO / "my-score.yaml"  # the config the block writes, as a user would
    existed = written.exists()
    cluster = ReadmeCluster()
    try:
        def ok(exports, command, node):
            out = cluster.run(exports, command, node)
            assert out.returncode == 0, "\n".join(cluster.log)
            return out.stdout

        def exports_of(section):
            return [c for c in section if c.startswith("export ")]

        for command in head:
            if command.startswith("export "):
                continue
            stdout = ok(exports_of(head), command, "head")
            if command.startswith("ray get-auth-token"):
                cluster.env["TOKEN"] = stdout.strip().splitlines()[-1].strip()
        assert re.fullmatch(r"[0-9a-f]{32,}", cluster.env.get("TOKEN", "")), cluster.log[-1]
        for command in scorer:
            if not command.startswith("export "):
                ok(exports_of(scorer), command, "scorer")
        status_command = next(c for c in client if c.startswith("serve status"))
        call = next(c for c in client if c.startswith("curl"))
        for command in client:
            if command.startswith("export ") or command in (status_command, call):
                continue
            ok(exports_of(client), command, "client")
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while deployment_states(cluster.run(exports_of(client), status_command, "client")
                                .stdout) != {"ScoreIngress": "HEALTHY", "ScoreWorker": "HEALTHY"}:
            assert time.monotonic() < deadline, "\n".join(cluster.log[-3:])
            time.sleep(3)
        answer = json.loads(ok(exports_of(client), call, "client"))
        assert len(answer["scores"]) == 2, answer
        assert all(0.0 <= p <= 1.0 for row in answer["scores"] for p in row), answer
    finally:
        left = cluster.close()
        if not existed:
            written.unlink(missing_ok=True)
    assert not left, f"processes of the test's nodes still running: {left}"


def test_the_block_is_read_as_three_sections_of_commands():
    head, scorer, client = commands_by_section(readme_block())
    assert any(c.startswith("ray start --head") for c in head)
    assert any(c.startswith("ray start --address=$HEAD_IP") for c in scorer)
    assert any(c.startswith("serve deploy") for c in client)
    # the call goes to the head's address (not loopback), as from another machine
    assert any(c.startswith("curl") and "http://$HEAD_IP:8000/" in c for c in client)
    assert all(c.startswith("export RAY_AUTH_MODE=token") for c in (head[0], scorer[0], client[0]))
