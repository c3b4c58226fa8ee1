"""The batch job on a two-node Ray cluster (two scoring nodes beside the head, on one machine):
with --scorer-resource, one scoring actor runs on each scoring node, and every row comes back
once."""

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cpu.test_two_node import REPO, STARTUP_TIMEOUT_S, TwoNodeCluster, wait_for
from tools.service import free_port

pytestmark = pytest.mark.service  # starts Ray

YES, NO = 10539, 5230


@pytest.fixture
def cluster():
    c = TwoNodeCluster()
    try:
        port = c.gcs_address.rsplit(":", 1)[1]
        # Two CPUs on the head: the Prepare actor and Ray Data's read and write tasks.
        c.start_node("head", "--head", f"--port={port}", "--num-cpus=2",
                     "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                     f"--dashboard-port={c.dashboard_url.rsplit(':', 1)[1]}",
                     f"--ray-client-server-port={free_port()}")
        c.start_scorer_node("scorer-1")
        c.start_scorer_node("scorer-2")
        wait_for(lambda: len([n for n in c.state("nodes") if n.get("state") == "ALIVE"]) == 3,
                 STARTUP_TIMEOUT_S, "three nodes alive", c)
        yield c
    finally:
        c.close()


def test_scoring_actors_run_on_both_scoring_nodes(cluster, tmp_path):
    rows = [{"id": i, "query": f"question {i}", "items": [f"answer {j}" for j in range(4)],
             "label_token_ids": [YES, NO]} for i in range(256)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    env = dict(cluster.env, RAY_ADDRESS=cluster.gcs_address, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "ranker_batch", "--config", str(REPO / "configs" / "score.yaml"),
         "--kind", "score", "--input", str(tmp_path / "in.parquet"), "--output",
         str(tmp_path / "out"), "--scorers", "2", "--scorer-resource", "scorer"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:] + cluster.logs()
    out = pq.read_table(tmp_path / "out", columns=["id", "error"]).to_pydict()
    assert sorted(out["id"]) == list(range(len(rows))) and out["error"] == [None] * len(rows)
    nodes = {n["node_id"]: n for n in cluster.state("nodes")}
    scorer_nodes = {a["node_id"] for a in cluster.state("actors")
                    if "MapBatches(Score)" in (a.get("class_name") or "")}
    assert len(scorer_nodes) == 2, scorer_nodes
    assert all(nodes[n]["resources_total"].get("scorer") == 1 for n in scorer_nodes)

