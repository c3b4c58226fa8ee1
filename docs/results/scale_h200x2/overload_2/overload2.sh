# 2 x H200: two scorer replicas (fixed), overload at 1 and 1.5 x 480 req/s (token ids), 4 client processes.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
source loadtest/gpu_service.sh
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
python3 scripts/make_random_model.py > /dev/null 2>&1
python3 -m loadtest.scale_config fixed2 $OUT/score-gpu-fixed2.yaml || exit 1
start_service $OUT/score-gpu-fixed2.yaml $OUT/serve-fixed2.log
python3 -m loadtest.loadgen overload --capacity-rps 480 --multiples 1,1.5 --clients 4 --duration 15 --warmup 3 --no-progress --out $OUT/overload_fixed2.json 2>&1 | grep "x1"
stop_service
