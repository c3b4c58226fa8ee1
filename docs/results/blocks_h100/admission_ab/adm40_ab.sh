# A/B on one machine: ingress admission 2 x 32 (A, before) vs 2 x 40 (B, shipped), overload from 255 req/s,
# token ids at 1, 1.2, 1.5, 3x; then text (natural words) at 250 req/s for 0-failure checks.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
source loadtest/gpu_service.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
lg() { python3 -m loadtest.loadgen "$@" --duration 15 --warmup 3 --no-progress 2>&1 | grep "x1\|x3\|offered"; }
for cfg in .device/score-gpu-32.yaml configs/score-gpu.yaml; do
  name=$(basename $cfg .yaml); echo "== $name"
  stop_service
  start_service $cfg $OUT/serve_$name.log
  lg overload --capacity-rps 255 --multiples 1,1.2,1.5,3 --out $OUT/overload_$name.json
  lg run --rate 250 --text natural --vocab 151643 --out $OUT/text250_$name.json
done
stop_service
