set -u
source .device/install.sh
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null
python3 -m loadtest.engine_latency --out $OUT/engine_latency.json 2>&1 | grep -v Warning
source loadtest/gpu_service.sh
stop_service
start_service configs/score-gpu.yaml $OUT/serve.log
python3 -m loadtest.loadgen single --requests 200 --no-progress --out $OUT/single.json
python3 -m loadtest.timing_probe --requests 100 --out $OUT/timing_idle.json
stop_service
