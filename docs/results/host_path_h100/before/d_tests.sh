source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 300 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -i "identical\|fused\|passed\|failed\|Error" | tail -12
timeout 200 python3 -m loadtest.engine_latency --out $OUT/engine_latency.json 2>&1 | grep -v Warn | tail -10
