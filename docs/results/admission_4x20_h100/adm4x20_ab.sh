# A/B on one machine: ingress admission 2 x 40 (A, shipped) vs 4 x 20 (B: the same 80 requests and
# 16 queued, over four processes), overload from 260 req/s (token ids, 1/1.2/1.5/3x), then text at 255 req/s.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
source loadtest/gpu_service.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
lg() { python3 -m loadtest.loadgen "$@" --duration 15 --warmup 3 --no-progress 2>&1 | grep "x1\|x3\|offered"; }
for cfg in configs/score-gpu.yaml .device/score-gpu-4x20.yaml; do
  name=$(basename $cfg .yaml); echo "== $name"
  stop_service
  start_service $cfg $OUT/serve_$name.log
  lg overload --capacity-rps 260 --multiples 1,1.2,1.5,3 --out $OUT/overload_$name.json
  lg run --rate 255 --text natural --vocab 151643 --out $OUT/text255_$name.json
done
stop_service
