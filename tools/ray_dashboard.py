"""Reach a local Ray cluster's dashboard with Ray's token authentication on.

Ray 2.60 starts a local cluster (`serve run`, `ray.init()`) with token authentication: it writes a
token to ~/.ray/auth_token (`ray get-auth-token` prints it; RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH
override the file) and every dashboard page and API asks for it: a browser through the
"Authentication Token Required" dialog (which then sets a cookie), a client through the header
`Authorization: Bearer TOKEN`. Ray's CLIs send it only when RAY_AUTH_MODE=token is set in their
environment (`RAY_AUTH_MODE=token serve status`). The metrics export port that Prometheus and
tools/prom.py scrape is not behind the token.

  python -m tools.ray_dashboard --serve-pid PID --url http://127.0.0.1:8000
waits until the service of `serve run` process PID answers /health, then prints how to open its
dashboard and run `serve status` (scripts/serve.sh calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent  # the ray and serve CLIs of this environment
DASHBOARD_LOG = re.compile(r"Dashboard head http address: (\S+)")
AUTH_ENV = {"RAY_AUTH_MODE": "token"}  # makes Ray's CLIs send the token


def session_dir_of(pid: int) -> Path:
    """The session directory of the Ray cluster that process `pid` (`serve run`) started,
    found through its GCS server's --log_dir (other clusters may run beside it)."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            for arg in child.cmdline():
                if arg.startswith("--log_dir=") and "/session_" in arg:
                    return Path(arg.split("=", 1)[1]).parent
        except psutil.Error:
            continue
    raise RuntimeError(f"no Ray session found under process {pid}")


def dashboard_url(session_dir: Path) -> str:
    """Where the session's dashboard listens (8265 unless that port was taken)."""
    log = session_dir / "logs" / "dashboard.log"
    found = DASHBOARD_LOG.findall(log.read_text(errors="replace")) if log.is_file() else []
    if not found:
        raise RuntimeError(f"no dashboard address in {log} (yet)")
    return f"http://{found[-1]}"


def auth_token() -> str:
    """The token, exactly as a user gets it: `ray get-auth-token`."""
    out = subprocess.run([str(BIN / "ray"), "get-auth-token"], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"`ray get-auth-token` failed: {out.stderr.strip()}")
    return out.stdout.strip()


def get(url: str, token: str | None = None, timeout_s: float = 10) -> tuple[int, str]:
    """GET `url` (with the token when given): (status, body)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=timeout_s) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def serve_applications(dashboard: str, token: str) -> dict:
    """Serve's REST API behind the dashboard (what its Serve page shows)."""
    status, body = get(f"{dashboard}/api/serve/applications/", token)
    if status != 200:
        raise RuntimeError(f"{dashboard}/api/serve/applications/ answered {status}: {body[:200]}")
    return json.loads(body)


def serve_status(dashboard: str) -> subprocess.CompletedProcess:
    """`serve status` against this dashboard, with the token from ~/.ray/auth_token."""
    return subprocess.run([str(BIN / "serve"), "status", "-a", dashboard], capture_output=True,
                          text=True, env={**os.environ, **AUTH_ENV}, timeout=120)


def how_to(dashboard: str) -> str:
    bin_dir = os.path.relpath(BIN)
    return (f"Ray dashboard: {dashboard} (token authentication is on). Paste the token that\n"
            f"    {bin_dir}/ray get-auth-token\n"
            "prints into its \"Authentication Token Required\" dialog (once per browser).\n"
            "Serve status:\n"
            f"    RAY_AUTH_MODE=token {bin_dir}/serve status -a {dashboard}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.ray_dashboard",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--serve-pid", type=int, required=True, help="the `serve run` process")
    p.add_argument("--url", required=True, help="the service's HTTP address")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for /health")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(args.serve_pid):
            return 1  # serve run exited; its own output says why
        try:
            if get(f"{args.url}/health", timeout_s=5)[0] == 200:
                break
        except OSError:
            pass
        time.sleep(1)
    else:
        return 1
    dashboard = dashboard_url(session_dir_of(args.serve_pid))
    print(f"\nService ready: {args.url} (Ctrl-C stops it)\n{how_to(dashboard)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
