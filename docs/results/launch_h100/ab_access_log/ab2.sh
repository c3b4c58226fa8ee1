# A/B on one machine, same code: access log on (before) vs off (now), ingress 2 x 64 in both.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 MAX_JOBS=16
source loadtest/gpu_service.sh
python3 scripts/make_random_model.py > /dev/null 2>&1
python3 -m loadtest.engine_latency --repeats 20 --out $OUT/engine_latency.json 2>&1 | grep -E "request|0 \+ 10 x 300|120 \+ 10 x 180"
for cfg in .device/score-gpu-2x64.yaml configs/score-gpu.yaml; do
  name=$(basename $cfg .yaml); echo "== $name"
  stop_service; start_service $cfg $OUT/serve_$name.log
  python3 -m loadtest.loadgen single --requests 100 --no-progress --out $OUT/single_$name.json 2>&1 | grep single
  python3 -m loadtest.timing_probe --requests 50 --out $OUT/timing_$name.json
  python3 -m loadtest.loadgen sweep --rates 200,230 --duration 15 --warmup 3 --p99-ms 500 --no-progress --out $OUT/sweep_$name.json 2>&1 | grep offered
  python3 -m loadtest.loadgen overload --capacity-rps 220 --multiples 1.5 --duration 15 --warmup 3 --no-progress --out $OUT/overload_$name.json 2>&1 | grep "x1"
done
stop_service
