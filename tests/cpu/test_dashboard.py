"""The Grafana board against a real Prometheus, with Ray's token authentication on: runs
`python -m tools.check_dashboard` (its own service and Prometheus; about 2 minutes on 2 cores)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tools.prometheus_server import find_prometheus

pytestmark = pytest.mark.service  # starts Ray (the slow tier)

REPO = Path(__file__).resolve().parents[2]


def test_every_panel_counts_what_was_sent():
    try:
        find_prometheus()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    out = subprocess.run([sys.executable, "-m", "tools.check_dashboard"],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-4000:]
    assert "dashboard check: every panel OK" in out.stdout
