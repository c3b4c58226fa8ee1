"""Load generator and benchmarks; every script runs as `python -m loadtest.NAME`."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "docs" / "results"  # committed results live beside the docs citing them
