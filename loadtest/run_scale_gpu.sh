#!/usr/bin/env bash
# Scaling runs on a multi-GPU host, from the repo root (each mode < 10 minutes):
#   source .device/install.sh && bash loadtest/run_scale_gpu.sh fixedN RATES [TEXT_RATES]
#   source .device/install.sh && bash loadtest/run_scale_gpu.sh auto PHASES
# fixed1/fixed2/fixed4: sweeps (bench workload: 120-token query + 10 items × 180 tokens, as token
# ids, then as natural text if TEXT_RATES is given) for the highest items/s at P99 ≤ 500 ms with
# N scorer replicas; load from CLIENTS client processes (default 4: one Python client tops out
# near 1,000 req/s). auto: the shipped autoscaling config under a ramp (PHASES =
# DURATION_S:RATE,...), with the replica/queue timeline from Prometheus.
# Results go to $OUT (default docs/results); fixedN also writes scale_fixedN.json (summary).
set -uo pipefail
mode=$1
arg=$2
text_arg=${3:-}
clients=${CLIENTS:-4}
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 \
  RAY_SERVE_THROUGHPUT_OPTIMIZED=1
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
  sweep() {  # sweep NAME RATES [loadgen args...]
    local name=$1 r=$2; shift 2
    python3 -m loadtest.loadgen sweep --rates "$r" --duration 15 --warmup 3 --p99-ms 500 \
      --clients "$clients" --no-progress --out "$out/$name.json" --plot "$out/$name.png" "$@" \
      | tail -6
  }
  sweep "sweep_$mode" "$arg"
  [ -n "$text_arg" ] && sweep "sweep_text_$mode" "$text_arg" --text natural --vocab 151643
  python3 - "$out" "$mode" "$arg" "$text_arg" "$clients" <<'PY'
import json, os, sys, torch
out, mode, rates, text_rates, clients = sys.argv[1:6]
def best(name):
    path = f"{out}/{name}.json"
    point = json.load(open(path))["best"] if os.path.exists(path) else None
    return point and point["achieved_items_per_s"]
summary = {
    "mode": mode, "scorer_replicas": int(mode[-1]),
    "token_max_items_per_s_at_p99_500ms": best(f"sweep_{mode}"),
    "text_max_items_per_s_at_p99_500ms": best(f"sweep_text_{mode}"),
    "gpu": torch.cuda.get_device_name(), "gpus_on_host": torch.cuda.device_count(),
    "cpus_on_host": os.cpu_count(),
    "command": f"source .device/install.sh && CLIENTS={clients} bash loadtest/run_scale_gpu.sh "
               f"{mode} {rates} {text_rates}".strip(),
}
json.dump(summary, open(f"{out}/scale_{mode}.json", "w"), indent=2)
print(json.dumps(summary))
PY
fi
grep -E "Upscaling|Downscaling|Adding|Removing" "$out/serve-$mode.log" | cut -c1-220 | tail -8
stop_service
