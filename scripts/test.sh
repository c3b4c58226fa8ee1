#!/usr/bin/env bash
# Sets up (if needed), lints, then runs the CPU test suite in two tiers: the fast one first
# (no Ray; about a minute), then the tests that start Ray or the Serve app (`-m service`).
#   bash scripts/test.sh           # everything (what CI runs)
#   bash scripts/test.sh --fast    # lint and the fast tier only
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
fast_only=false
if [ "${1:-}" = "--fast" ]; then fast_only=true; shift; fi
bash scripts/setup.sh
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/python -m pytest tests/cpu -q -m "not service" "$@"
if [ "$fast_only" = false ]; then
  .venv/bin/python -m pytest tests/cpu -q -m service "$@"
fi
