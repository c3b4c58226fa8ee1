"""A real Prometheus server scraping one local Ray cluster, and its HTTP query API.

Ray writes the scrape targets of its nodes to `prom_metrics_service_discovery.json` in the
session directory (and links the newest session's file from /tmp/ray/, which another cluster
on the machine may own). Prometheus reads that file through `file_sd_configs`, exactly as Ray's
own generated config (session_dir/metrics/prometheus/prometheus.yml) does, but every second
instead of every ten. The binary is the one on PATH (Debian: `apt-get install prometheus`;
scripts/setup.sh installs it when run as root), run directly with a temporary config and
storage, never as the system service.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tools.service import LocalServer, free_port

DISCOVERY_FILE = "prom_metrics_service_discovery.json"
SCRAPE_INTERVAL_S = 1
STARTUP_TIMEOUT_S = 60


def find_prometheus() -> str:
    path = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin:/usr/sbin")
    if path is None:
        raise FileNotFoundError(
            "no `prometheus` binary: install it (Debian/Ubuntu: `apt-get install -y "
            "prometheus`; `bash scripts/setup.sh` does it when run as root) or put one on PATH")
    return path


@dataclass
class PrometheusServer(LocalServer):
    LOG_FILE = "prometheus.log"

    def api(self, path: str, **params) -> dict | list:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query: [{"metric": {labels}, "value": [time, "number"]}, ...]."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self.api("query", **params)["result"]

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_prometheus(session_dir: Path) -> PrometheusServer:
    """Prometheus scraping the Ray cluster of `session_dir` every SCRAPE_INTERVAL_S; ready when
    returned (stop() it)."""
    binary = find_prometheus()
    workdir = Path(tempfile.mkdtemp(prefix="prometheus-"))
    config = {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                   "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": [{"job_name": "ray", "file_sd_configs": [
            {"files": [str(session_dir / DISCOVERY_FILE)], "refresh_interval": "5s"}]}],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is valid YAML
    port = free_port()
    with open(workdir / PrometheusServer.LOG_FILE, "w") as log:
        proc = subprocess.Popen([binary, f"--config.file={workdir / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={workdir / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, workdir)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log_text = server.log
            server.stop()
            raise RuntimeError(f"prometheus exited ({proc.returncode}):\n{log_text[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=5) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"prometheus not ready after {STARTUP_TIMEOUT_S} s")
