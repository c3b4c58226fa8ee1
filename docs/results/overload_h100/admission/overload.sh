set -u
source .device/install.sh
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1
source loadtest/gpu_service.sh
stop_service
python3 scripts/make_random_model.py > /dev/null
start_service configs/score-gpu.yaml $OUT/serve.log
python3 -m loadtest.loadgen sweep --rates 200,220,240 --duration 15 --warmup 3 --p99-ms 500 \
  --no-progress --out $OUT/sweep.json --plot $OUT/sweep.png 2>&1 | grep -E "offered|best"
python3 -m loadtest.loadgen overload --capacity-rps ${1:-220} --multiples 1,1.2,1.5,3 \
  --duration 15 --warmup 3 --no-progress --out $OUT/overload.json 2>&1 | grep -E "^x"
stop_service
