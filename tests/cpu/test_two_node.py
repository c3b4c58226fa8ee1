"""Two Ray nodes on one machine, deployed the way a Ray user deploys to a running cluster:
`ray start --head`, a second `ray start --address=...` offering a custom `scorer` resource, and
`serve deploy` of a variant of configs/score.yaml whose ScoreWorker asks for that resource. The
scorer replica runs on the second node and the ingress on the head; with the scorer node gone
the ingress answers 503 (not a hang, not a 500) and scoring comes back with the node. API keys
are on (auth.api_keys_file, read by the app built on the cluster): requests send one."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.cpu.processes import kill_all
from tools.service import deployment, free_port, small_model_config

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STARTUP_TIMEOUT_S = 240
# The GCS declares a SIGKILLed node dead after its health checks fail (~30 s by default).
NODE_DEATH_TIMEOUT_S = 180
SCORER = "ServeReplica:score:ScoreWorker"
INGRESS = "ServeReplica:score:ScoreIngress"
BODY = {"query": [1, 2, 3, 4], "items": [[5, 6], [7]], "label_token_ids": [10, 20]}
API_KEY = f"rk-two-node-{secrets.token_urlsafe(24)}"
# With API keys on, the app holds the quota ledger too (serve_app/quota_ledger.py).
HEALTHY = {"ScoreIngress": "HEALTHY", "ScoreWorker": "HEALTHY", "QuotaLedger": "HEALTHY"}


class TwoNodeCluster:
    """A head node and scorer nodes started by this test, each `ray start --block` in its own
    session, stopped by killing exactly the processes of that node (never `ray stop`, which
    stops every Ray node of this machine, other people's included)."""

    def __init__(self) -> None:
        # A short root: Ray's unix socket paths must stay under 108 characters.
        self.root = Path(tempfile.mkdtemp(prefix="tn", dir="/tmp"))
        # Ray 2.60 turns token authentication on for `ray start --head` whenever a token exists
        # (~/.ray/auth_token), and then every CLI call must present it. The test keeps it on, with
        # a token of its own given to every process below through the environment: it neither
        # reads nor writes the user's token file, and passes whether one exists or not.
        self.env = {k: v for k, v in os.environ.items()
                    if k != "RAY_ADDRESS" and not k.startswith("RAY_AUTH")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                        RAY_USAGE_STATS_ENABLED="0")
        self.gcs_address = f"127.0.0.1:{free_port()}"
        self.dashboard_url = f"http://127.0.0.1:{free_port()}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.killed: list[psutil.Process] = []  # every process this test stopped

    def start_node(self, name: str, *args: str) -> None:
        # Ports with fixed defaults are given free ones: other Ray clusters run on this machine.
        command = [str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
                   f"--temp-dir={self.root / name}", f"--metrics-export-port={free_port()}",
                   f"--dashboard-agent-listen-port={free_port()}", *args]
        with open(self.root / f"{name}.log", "w") as log:
            self.nodes[name] = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def start_head(self) -> None:
        port = self.gcs_address.rsplit(":", 1)[1]
        dashboard_port = self.dashboard_url.rsplit(":", 1)[1]
        # No scorer resource here, and one CPU: room for the ingress (0.5 CPU) only.
        self.start_node("head", "--head", f"--port={port}", "--num-cpus=1",
                        "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                        f"--dashboard-port={dashboard_port}",
                        f"--ray-client-server-port={free_port()}")

    def start_scorer_node(self, name: str) -> None:
        # No CPU slots: only an actor asking for `scorer` (and no CPU) can land here.
        self.start_node(name, f"--address={self.gcs_address}", "--num-cpus=0",
                        '--resources={"scorer": 1}')

    def processes(self, name: str) -> list[psutil.Process]:
        """The node's `ray start` and every process under it (raylet, agents, its actors;
        actor processes lead process groups of their own, so a group kill would miss them)."""
        try:
            top = psutil.Process(self.nodes[name].pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of one node: the node is lost as if its machine went away."""
        procs = self.processes(name)
        self.killed.extend(procs)
        kill_all(procs)
        self.nodes[name].wait(timeout=30)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def state(self, what: str) -> list[dict]:
        """`ray list nodes|actors` through this cluster's dashboard (the state API)."""
        out = self.cli("ray", "list", what, "--format=json", "--detail", "--limit=1000",
                       f"--address={self.dashboard_url}")
        # An empty list prints "No resource in the cluster"; not up yet: a failure.
        return json.loads(out.stdout) if out.stdout.startswith("[") else []

    def serve_status(self) -> dict:
        out = self.cli("serve", "status", f"--address={self.dashboard_url}")
        return (yaml.safe_load(out.stdout) or {}) if out.returncode == 0 else {}

    def logs(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                       for p in sorted(self.root.glob("*.log")))

    def close(self) -> None:
        for name in list(self.nodes):
            self.kill_node(name)
        shutil.rmtree(self.root, ignore_errors=True)


def wait_for(check, timeout_s: float, what: str, cluster: TwoNodeCluster) -> None:
    """wait_until that shows the cluster's logs when the state never comes."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return
        time.sleep(1)
    pytest.fail(f"not {what} after {timeout_s} s:\n{cluster.logs()}")


def deployment_states(status: dict) -> dict[str, str]:
    app = status.get("applications", {}).get("score", {})
    return {name: d.get("status") for name, d in app.get("deployments", {}).items()}


def running_scorers(status: dict) -> int:
    app = status.get("applications", {}).get("score", {})
    worker = app.get("deployments", {}).get("ScoreWorker", {})
    return (worker.get("replica_states") or {}).get("RUNNING", 0)


def alive_nodes(cluster: TwoNodeCluster) -> list[dict]:
    return [n for n in cluster.state("nodes") if n.get("state") == "ALIVE"]


def actor_nodes(cluster: TwoNodeCluster, class_name: str) -> list[str]:
    return [a["node_id"] for a in cluster.state("actors")
            if a.get("class_name") == class_name and a.get("state") == "ALIVE"]


def health(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=30).status_code
    except httpx.HTTPError:
        return 0


def post_score(url: str) -> httpx.Response:
    # A client timeout far above the time a 503 needs: a hang fails the test, it does not
    # turn into a 408 from the proxy (request_timeout_s is raised above it in the config).
    return httpx.post(f"{url}/v1/score", json=BODY, timeout=150,
                      headers={"Authorization": f"Bearer {API_KEY}"})


def test_scorer_on_second_node_lost_then_back(small_model):
    config = small_model_config(small_model)
    http_port = free_port()
    config["http_options"].update(port=http_port, request_timeout_s=300)
    worker = deployment(config, "ScoreWorker")
    worker["ray_actor_options"] = {"num_cpus": 0, "resources": {"scorer": 1}}
    url = f"http://127.0.0.1:{http_port}"

    cluster = TwoNodeCluster()
    try:
        keys_path = cluster.root / "api-keys"
        keys_path.write_text(f"two-node:{API_KEY}\n")
        config["applications"][0]["args"]["auth"] = {"api_keys_file": str(keys_path)}
        config_path = cluster.root / "score.yaml"
        config_path.write_text(yaml.safe_dump(config))
        cluster.start_head()
        wait_for(lambda: len(alive_nodes(cluster)) == 1, STARTUP_TIMEOUT_S, "head up", cluster)
        cluster.start_scorer_node("scorer1")
        wait_for(lambda: len(alive_nodes(cluster)) == 2, STARTUP_TIMEOUT_S, "two nodes up",
                 cluster)

        deployed = cluster.cli("serve", "deploy", str(config_path),
                               f"--address={cluster.dashboard_url}", timeout=STARTUP_TIMEOUT_S)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        wait_for(lambda: deployment_states(cluster.serve_status()) == HEALTHY, STARTUP_TIMEOUT_S,
                 "every deployment healthy", cluster)
        status = cluster.serve_status()
        assert status["applications"]["score"]["status"] == "RUNNING"
        assert running_scorers(status) == 1

        first = post_score(url)
        assert first.status_code == 200, first.text
        scores = first.json()["scores"]
        assert len(scores) == 2 and all(len(row) == 2 for row in scores)
        assert httpx.post(f"{url}/v1/score", json=BODY, timeout=150).status_code == 401

        nodes = {n["node_id"]: n for n in alive_nodes(cluster)}
        head = next(i for i, n in nodes.items() if n["is_head_node"])
        scorer_node = next(i for i, n in nodes.items() if "scorer" in n["resources_total"])
        assert head != scorer_node
        assert actor_nodes(cluster, SCORER) == [scorer_node]
        assert actor_nodes(cluster, INGRESS) == [head]

        # The scorer node goes away; the head, the proxy and the ingress stay.
        cluster.kill_node("scorer1")
        wait_for(lambda: len(alive_nodes(cluster)) == 1, NODE_DEATH_TIMEOUT_S,
                 "scorer node seen dead", cluster)
        wait_for(lambda: running_scorers(cluster.serve_status()) == 0, NODE_DEATH_TIMEOUT_S,
                 "no scorer running", cluster)
        asked = time.monotonic()
        lost = post_score(url)
        print(f"\nno scorer: {lost.status_code} after {time.monotonic() - asked:.1f} s")
        assert lost.status_code == 503, lost.text
        error = lost.json()["error"]
        assert error["type"] == "ServiceUnavailableError" and "scorer" in error["message"]
        assert lost.headers["Retry-After"] == "1"
        assert health(url) == 503

        # A new scorer node: Serve places the pending replica there and scoring recovers.
        cluster.start_scorer_node("scorer2")
        wait_for(lambda: health(url) == 200, STARTUP_TIMEOUT_S, "healthy again", cluster)
        again = post_score(url)
        assert again.status_code == 200, again.text
        # The same weights on a new node: the same scores.
        assert sum(again.json()["scores"], []) == pytest.approx(sum(scores, []), abs=1e-6)
        new_scorer_node = next(n["node_id"] for n in alive_nodes(cluster)
                               if "scorer" in n["resources_total"])
        assert actor_nodes(cluster, SCORER) == [new_scorer_node]
        assert deployment_states(cluster.serve_status()) == HEALTHY
    finally:
        cluster.close()
    # Every process of both nodes (actors included) is gone, and nothing else was touched.
    assert cluster.killed and not [p for p in cluster.killed if p.is_running()]
