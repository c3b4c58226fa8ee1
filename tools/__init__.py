"""The project's user-facing tools, and the client libraries they share. Each tool runs as
`python -m tools.NAME` (`--help` shows its options; its module docstring its usage):

  loadgen          open-loop load generator: run, sweep, overload, single (back-to-back latency
                   and its Server-Timing stages), sporadic (a lone request on an idle service)
  ramp             a load ramp in phases with the service's timeline (replicas, queues)
  plot             the PNG of a loadgen sweep's or a ramp's JSON
  fidelity         how much FP8 changes a model's rankings (fidelity_set: its labelled requests)
  random_model     HF folders with seeded random weights and a real tokenizer (--shape)
  ray_dashboard    reach the Ray dashboard with token authentication (scripts/serve.sh runs it)
  check_dashboard  the Grafana board against a real Prometheus and the service
  screenshot_dashboard  the Ray dashboard's Serve page as a PNG, in a headless browser
  cpu_table        the README's CPU table: starts the CPU default, measures, writes
                   docs/results/cpu/cpu.json and the table (--tables-only, --check)
Libraries: workload (request shapes and bodies), stats, http_client and client_pool (the
open-loop senders), cli_args, prom (a node's metrics), prometheus_server, service (`serve run` of
a shipped config, configs: those configs), doc_blocks (the generated blocks of the docs).
Layers (tests/cpu/test_config.py): tools import the product packages only; loadtest (the
benchmarks) and tests import tools.
"""

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "docs" / "results"  # committed results live beside the docs citing them
DEFAULT_MODEL = REPO_ROOT / "models" / "smollm2-135m-instruct"  # configs/score.yaml's model_path


def git_commit() -> str:
    """The short hash of the checkout's HEAD: the commit a result measured ("unknown" outside
    a git checkout)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def gpu_name() -> str:
    """The first GPU's name as nvidia-smi gives it: the GPU a result measured ("unknown"
    without one)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                              "0"], capture_output=True, text=True)
    except OSError:  # no nvidia-smi
        return "unknown"
    return (out.stdout.strip() if out.returncode == 0 else "") or "unknown"
