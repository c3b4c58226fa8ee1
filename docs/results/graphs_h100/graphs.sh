# CUDA-graph check on one GPU: GPU tests (with the graph tests), then lone-request latency per shape.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 330 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -v "^$" | tail -45
timeout 200 python3 -m loadtest.engine_latency --out $OUT/engine_latency.json 2>&1 | tail -16
