#!/usr/bin/env bash
# Sets up (if needed) and serves the default model: HTTP on 127.0.0.1:8000. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1
CONFIG=${1:-configs/score.yaml}
.venv/bin/python -m ranker_app.check_config "$CONFIG"
exec .venv/bin/serve run "$CONFIG"
