"""Shared fixtures: the real Serve app, started once per test run with `serve run`."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 240

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server_url():
    """Base URL of configs/score.yaml served by `serve run` (only the HTTP port is changed)."""
    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.fail(f"{DEFAULT_MODEL} is missing: run `python scripts/prepare_model.py`")
    config = yaml.safe_load((REPO / "configs" / "score.yaml").read_text())
    port = _free_port()
    config["http_options"]["port"] = port
    workdir = Path(tempfile.mkdtemp(prefix="score-serve-"))
    (workdir / "score.yaml").write_text(yaml.safe_dump(config))
    log = open(workdir / "serve.log", "w")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    serve_bin = Path(sys.executable).parent / "serve"
    proc = subprocess.Popen(
        [str(serve_bin), "run", str(workdir / "score.yaml")],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, workdir / "serve.log")
        yield url
    finally:
        _stop(proc)
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve run exited ({proc.returncode}):\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"service not healthy after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen) -> None:
    # Ctrl-C makes `serve run` delete the app and stop the Ray instance it started.
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def client(server_url):
    with httpx.Client(base_url=server_url, timeout=60) as c:
        yield c
