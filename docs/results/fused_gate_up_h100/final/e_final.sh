# Final gpu_worker code: GPU tests, then the engine bench A/B (fused gate/up vs unfused) again.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 300 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -i "identical\|fused\|passed\|failed\|Error" | tail -12
timeout 250 python3 -m loadtest.bench_engine --modes engine,unfused_gate_up --out $OUT/bench_engine.json 2>&1 | grep -v Warn | tail -8
