# Graph tests, then the HTTP end-to-end run (single, timing, token + text sweeps, overload).
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 150 python3 -m pytest tests/gpu/test_gpu_graphs.py -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_graph_tests.log | grep -v "^$\|Loading" | tail -25
OUT=$OUT timeout 400 bash loadtest/run_e2e_gpu.sh 220,240,260 220,240 2>&1 | grep -v "Warning\|warn" | tail -30
grep -h "captured\|warm-up done" $OUT/serve.log | cut -c1-250 | head -4
