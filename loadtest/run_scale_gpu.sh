#!/usr/bin/env bash
# Scaling runs on a 2-GPU host, from the repo root (each mode < 10 minutes):
#   source .device/install.sh && bash loadtest/run_scale_gpu.sh fixed1 RATES
#   source .device/install.sh && bash loadtest/run_scale_gpu.sh fixed2 RATES
#   source .device/install.sh && bash loadtest/run_scale_gpu.sh auto PHASES
# fixed1/fixed2: a sweep (bench workload: 120-token query + 10 items × 180 tokens) for the highest
# items/s at P99 ≤ 500 ms with 1 or 2 scorer replicas. auto: the shipped autoscaling config under
# a ramp (PHASES = DURATION_S:RATE,...), with the replica/queue timeline from Prometheus.
# Results go to $OUT (default docs/results).
set -uo pipefail
mode=$1
arg=$2
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1
export RAY_metrics_report_interval_ms=1000  # Prometheus values every second
source loadtest/gpu_service.sh
stop_service
python3 scripts/make_random_model.py > /dev/null || exit 1
config="$out/score-gpu-$mode.yaml"
python3 -m loadtest.scale_config "$mode" "$config" || exit 1
python3 -m ranker_app.check_config "$config" || exit 1
start_service "$config" "$out/serve-$mode.log"
if [ "$mode" = auto ]; then
  python3 -m loadtest.ramp --phases "$arg" --query-len 120 --items 10 --item-len 180 \
    --vocab 151643 --out "$out/ramp_gpu.json" --plot "$out/ramp_gpu.png" | tail -3
  sleep 75  # past downscale_delay_s (60): the second replica drains and stops
  python3 - "$out" <<'PY'
import json, sys
from loadtest.prom import find_metrics_url, scrape, service_sample
s = service_sample(scrape(find_metrics_url()))
print("after the ramp + 75 s: target replicas", s.target_replicas)
r = json.load(open(f"{sys.argv[1]}/ramp_gpu.json")); r["target_replicas_75s_after"] = s.target_replicas
json.dump(r, open(f"{sys.argv[1]}/ramp_gpu.json", "w"), indent=1)
PY
else
  python3 -m loadtest.loadgen sweep --rates "$arg" --duration 15 --warmup 3 --p99-ms 500 \
    --no-progress --out "$out/sweep_$mode.json" --plot "$out/sweep_$mode.png" | tail -4
fi
grep -E "Upscaling|Downscaling|Adding|Removing" "$out/serve-$mode.log" | cut -c1-220 | tail -8
stop_service
