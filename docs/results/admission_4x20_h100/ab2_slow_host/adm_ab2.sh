# A/B on one machine, short: 2 x 40 vs 4 x 20 (the same 80 requests over four processes):
# idle single requests, then overload from 260 req/s at 1.5x and 3x.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
source loadtest/gpu_service.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
for cfg in .device/score-gpu-2x40.yaml configs/score-gpu.yaml; do
  name=$(basename $cfg .yaml); echo "== $name"
  stop_service
  start_service $cfg $OUT/serve_$name.log
  python3 -m loadtest.loadgen single --requests 100 --no-progress --out $OUT/single_$name.json 2>&1 | grep "single"
  python3 -m loadtest.loadgen overload --capacity-rps 260 --multiples 1.5,3 --duration 15 --warmup 3 --no-progress --out $OUT/overload_$name.json 2>&1 | grep "x1\|x3"
done
stop_service
