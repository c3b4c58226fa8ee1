source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null 2>&1
for r in 1 2; do
  PYTHONPATH=.device/base:.:$PYTHONPATH timeout 120 python3 .device/launch_host.py base$r 2>&1 | grep gpu_worker
  PYTHONPATH=.:$PYTHONPATH timeout 120 python3 .device/launch_host.py new$r 2>&1 | grep gpu_worker
done
timeout 300 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -i "passed\|failed\|Error" | tail -12
timeout 200 python3 -m loadtest.engine_latency --out $OUT/engine_latency.json 2>&1 | grep -v Warn | tail -12
