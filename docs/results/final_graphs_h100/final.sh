# Final code: all GPU tests, then the HTTP end-to-end run (single, timing, sweeps, overload).
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 200 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -v "^$\|Loading\|graphs vs eager" | tail -8
OUT=$OUT timeout 480 bash loadtest/run_e2e_gpu.sh 220,240,260 200,220,240 2>&1 | grep -v "Warning\|warn" | tail -16
