# Overload at 1, 1.2, 1.5, 3 x 230 req/s (token ids) and latency vs load, shipped GPU config.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
source loadtest/gpu_service.sh
stop_service
python3 scripts/make_random_model.py > /dev/null 2>&1
start_service configs/score-gpu.yaml $OUT/serve.log
python3 -m loadtest.loadgen overload --capacity-rps 230 --multiples 1,1.2,1.5,3 --duration 15 --warmup 3 --no-progress --out $OUT/overload.json 2>&1 | grep -v "Warn\|warn"
python3 -m loadtest.loadgen sweep --rates 23,115,207 --duration 15 --warmup 3 --p99-ms 500 --no-progress --out $OUT/load_levels.json --plot $OUT/load_levels.png 2>&1 | grep offered
python3 -m loadtest.loadgen overload --capacity-rps 230 --multiples 1.5 --text natural --vocab 151643 --duration 15 --warmup 3 --no-progress --out $OUT/overload_text.json 2>&1 | grep -v "Warn\|warn"
stop_service
