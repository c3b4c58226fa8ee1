"""Start the real app with `serve run` on a variant of a shipped config, for the tools (the
dashboard check, the prefix benchmark) and the integration tests (tests/support adds their
views of it). Failures raise RuntimeError or TimeoutError with the service's log."""

from __future__ import annotations

import copy
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tools import DEFAULT_MODEL, REPO_ROOT
from tools.configs import shipped_yaml
from tools.prom import find_metrics_url
from tools.ray_dashboard import dashboard_url, session_dir_of

STARTUP_TIMEOUT_S = 240
# Prometheus values every second instead of every ten (Ray system config, read from the env).
FAST_METRICS_ENV = {"RAY_metrics_report_interval_ms": "1000"}


def small_model_config(model_path) -> dict:
    """configs/score.yaml pointed at the small model (tools/random_model.py), sized for a
    2-core CI machine: one torch thread per scorer and short batches, so one scorer replica
    saturates at ~20 requests/s."""
    config = shipped_yaml("score.yaml")
    args = config["applications"][0]["args"]
    args.update(model_path=str(model_path), served_model_name="small-random")
    args["engine"]["torch_threads"] = 1
    args["scheduler"]["max_batch_tokens"] = 1024
    args["limits"].update(max_seq_tokens=1024, max_tokens_per_request=8192)
    ingress = deployment(config, "ScoreIngress")
    ingress.pop("autoscaling_config")
    ingress.update(num_replicas=1)
    return config


# Ray's worker processes take ports 10002-19999 by default, and every process Ray starts binds
# kernel-chosen (ephemeral) ports while it comes up: a port picked in either range can be taken
# between our pick and the bind by the service we start (seen in CI as "Failed to bind").
_RAY_WORKER_PORTS_END = 20000


def _ephemeral_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_handed_out: set[int] = set()  # a caller may ask for several before binding any


def free_port() -> int:
    """A port free now, chosen outside the ranges Ray and the kernel hand out by themselves."""
    candidates = list(set(range(_RAY_WORKER_PORTS_END, _ephemeral_ports_start())) - _handed_out)
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deployment(config: dict, name: str) -> dict:
    """The `deployments:` entry called `name` of the first application (to edit in place)."""
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == name)


@dataclass
class LocalServer:
    """A server this tooling started: its URL, process, and working folder holding LOG_FILE."""

    url: str
    proc: subprocess.Popen
    workdir: Path
    LOG_FILE = "serve.log"

    @property
    def log(self) -> str:
        return (self.workdir / self.LOG_FILE).read_text(errors="replace")


@dataclass
class Service(LocalServer):
    """`serve run` of a config (start_service)."""

    def session_dir(self) -> Path:
        """This service's own Ray session directory (other clusters may run beside it)."""
        return session_dir_of(self.proc.pid)

    def metrics_url(self) -> str:
        """Prometheus endpoint of this service's own Ray node."""
        return find_metrics_url(str(self.session_dir()))

    def dashboard_url(self) -> str:
        return dashboard_url(self.session_dir())


def serve_cli() -> list[str]:
    """Serve's CLI of this Python: its `serve` script, or the same entry point through the
    interpreter where packages sit on PYTHONPATH without their scripts (the GPU machine)."""
    script = Path(sys.executable).parent / "serve"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from ray.serve.scripts import cli; cli()"]


def start_service(config: dict, extra_env: dict[str, str] | None = None) -> Service:
    """`serve run` of `config` (its HTTP port replaced by a free one); healthy when returned."""
    service = launch_service(config, free_port(), extra_env)
    try:
        wait_until(lambda: _healthy(service), STARTUP_TIMEOUT_S, "service healthy", service)
    except BaseException:
        stop_service(service)
        raise
    return service


def launch_service(config: dict, port: int, extra_env: dict[str, str] | None = None) -> Service:
    """`serve run` of `config` on HTTP port `port`, returned at once (not waited for); the
    caller stops it (stop_service)."""
    model = Path(config["applications"][0]["args"].get("model_path", DEFAULT_MODEL))
    if not ((model if model.is_absolute() else REPO_ROOT / model) / "config.json").is_file():
        raise RuntimeError(f"{model} is missing: run `python scripts/prepare_model.py` (the "
                           "default model) or `python -m tools.random_model`")
    config = copy.deepcopy(config)
    config["http_options"]["port"] = port
    workdir = Path(tempfile.mkdtemp(prefix="score-serve-"))
    (workdir / "score.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(extra_env or {})
    with open(workdir / Service.LOG_FILE, "w") as log:
        proc = subprocess.Popen(
            [*serve_cli(), "run", str(workdir / "score.yaml")],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    return Service(f"http://127.0.0.1:{port}", proc, workdir)


@contextmanager
def serving(config: dict, extra_env: dict[str, str] | None = None) -> Iterator[Service]:
    """start_service, stopped on leaving the block (an error included)."""
    service = start_service(config, extra_env)
    try:
        yield service
    finally:
        stop_service(service)


def _healthy(service: Service) -> bool:
    if service.proc.poll() is not None:
        raise RuntimeError(f"serve run exited ({service.proc.returncode}):\n"
                           f"{service.log[-4000:]}")
    try:
        return httpx.get(f"{service.url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(check: Callable[[], bool], timeout_s: float, what: str,
               service: Service | None = None, every_s: float = 0.5) -> float:
    """Poll `check` until true; returns the seconds it took. Raises TimeoutError (with the
    service's log) when it never is."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(every_s)
    tail = f":\n{service.log[-4000:]}" if service else ""
    raise TimeoutError(f"not {what} after {timeout_s} s{tail}")


def stop_service(service: LocalServer) -> None:
    # Ctrl-C makes `serve run` delete the app and stop the Ray instance it started.
    try:
        os.killpg(service.proc.pid, signal.SIGINT)
        service.proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(service.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
