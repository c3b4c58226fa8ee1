# A/B: ingress 2 x 64 (before) vs 4 x 32 (now), same code: token sweep 240,270 then 1.5x overload.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 MAX_JOBS=16
source loadtest/gpu_service.sh
python3 scripts/make_random_model.py > /dev/null 2>&1
for cfg in .device/score-gpu-2x64.yaml configs/score-gpu.yaml; do
  name=$(basename $cfg .yaml); echo "== $name"
  stop_service; start_service $cfg $OUT/serve_$name.log
  (sleep 30; top -b -n 1 -w 220 | head -28 > $OUT/top_$name.txt) &
  python3 -m loadtest.loadgen sweep --rates 240,270 --duration 15 --warmup 3 --p99-ms 500 --no-progress --out $OUT/sweep_$name.json 2>&1 | grep offered
  python3 -m loadtest.loadgen overload --capacity-rps 240 --multiples 1.5 --duration 15 --warmup 3 --no-progress --out $OUT/overload_$name.json 2>&1 | grep "x1"
done
stop_service
