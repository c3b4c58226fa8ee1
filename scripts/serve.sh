#!/usr/bin/env bash
# Sets up (if needed) and serves the default model: HTTP on 127.0.0.1:8000. Ctrl-C stops it.
# Once it answers, prints how to open the Ray dashboard and run `serve status` (Ray's token
# authentication is on; README "Watching it").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1
CONFIG=${1:-configs/score.yaml}
.venv/bin/python -m ranker_app.check_config "$CONFIG"
URL=$(.venv/bin/python -c "import sys, yaml; h = yaml.safe_load(open(sys.argv[1]))['http_options']
print(f\"http://{h.get('host', '127.0.0.1')}:{h.get('port', 8000)}\")" "$CONFIG")
# In the background: waits for /health of the `serve run` below (this process, after exec).
.venv/bin/python -m tools.ray_dashboard --serve-pid $$ --url "$URL" &
exec .venv/bin/serve run "$CONFIG"
