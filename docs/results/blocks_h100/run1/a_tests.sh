# Blocks layout: GPU tests, then lone-request engine latency.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 380 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -v "^$\|Loading" | tail -22
timeout 180 python3 -m loadtest.engine_latency --out $OUT/engine_latency.json 2>&1 | grep -v Warn | tail -16
