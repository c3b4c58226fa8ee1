#!/usr/bin/env bash
# End-to-end load test on the GPU machine, from the repo root, in under 10 minutes:
#   source .device/install.sh && bash loadtest/run_e2e_gpu.sh [RATES]
# Starts configs/score-gpu.yaml (ingress + one GPU replica, HAProxy front door), measures idle
# single-request latency (200 sequential requests of 10 items × 300 tokens), the Server-Timing
# breakdown, and an open-loop Poisson sweep of the bench workload (120-token query + 10 items ×
# 180 tokens); writes JSON to $OUT (or docs/results) and a summary e2e_gpu.json.
set -uo pipefail
rates=${1:-60,100,140,180,220,260}
config=${CONFIG:-configs/score-gpu.yaml}
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1
source loadtest/gpu_service.sh
stop_service  # a service left by an earlier run on this machine would answer in our place
python3 scripts/make_random_model.py > /dev/null || exit 1
python3 -m ranker_app.check_config "$config" || exit 1
start_service "$config" "$out/serve.log"
python3 -m loadtest.loadgen single --requests 200 --no-progress --out "$out/single.json"
python3 -m loadtest.timing_probe --requests 100 --out "$out/timing_idle.json"
python3 -m loadtest.loadgen sweep --rates "$rates" --duration 15 --warmup 3 --p99-ms 500 \
  --no-progress --out "$out/sweep.json" --plot "$out/sweep.png"
python3 - "$out" "$rates" "$config" <<'PY'
import json, sys, torch
out, rates, config = sys.argv[1:4]
single = json.load(open(f"{out}/single.json"))["result"]["latency_ms"]
sweep = json.load(open(f"{out}/sweep.json"))
best = sweep["best"]
summary = {
    "max_items_per_s_at_p99_500ms": best and best["achieved_items_per_s"],
    "best_point": best,
    "idle_p50_ms": single["p50"], "idle_p99_ms": single["p99"],
    "gpu": torch.cuda.get_device_name(),
    "command": f"source .device/install.sh && CONFIG={config} bash loadtest/run_e2e_gpu.sh {rates}",
}
json.dump(summary, open(f"{out}/e2e_gpu.json", "w"), indent=2)
print(json.dumps(summary))
PY
stop_service
