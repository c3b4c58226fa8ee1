# A/B on one machine: ingress admission 2 x 64 (autoscaled 2..4, A) vs 2 x 32 fixed (B, shipped).
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
source loadtest/gpu_service.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
lg() { python3 -m loadtest.loadgen "$@" --duration 15 --warmup 3 --no-progress 2>&1 | grep "x1\|x3\|offered"; }
for cfg in configs/score-gpu.yaml .device/score-gpu-64.yaml; do
  name=$(basename $cfg .yaml); echo "== $name"
  stop_service
  start_service $cfg $OUT/serve_$name.log
  lg overload --capacity-rps 230 --multiples 1,1.2,1.5,3 --out $OUT/overload_$name.json
  if [ $name = score-gpu ]; then
    lg overload --capacity-rps 220 --multiples 1,1.5 --text natural --vocab 151643 --out $OUT/overload_text_$name.json
    lg sweep --rates 23,115,207 --p99-ms 500 --out $OUT/load_levels_$name.json --plot $OUT/load_levels_$name.png
  fi
done
stop_service
