#!/usr/bin/env bash
# Sets up (if needed) and runs the CPU test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1
exec .venv/bin/python -m pytest tests/cpu -q "$@"
