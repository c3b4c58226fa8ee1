# Idle 10 x 300 latency over HTTP, the worker before (.device/base = main before the host-path
# change) and after, alternating on one machine; the shipped config and front door.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16 RAY_USAGE_STATS_ENABLED=0 \
  RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1
python3 scripts/make_random_model.py > /dev/null 2>&1
source loadtest/gpu_service.sh
cp -r gpu_worker .device/new_worker
for run in base1 new1 base2 new2; do
  rm -rf gpu_worker
  case $run in base*) cp -r .device/base/gpu_worker gpu_worker ;; *) cp -r .device/new_worker gpu_worker ;; esac
  stop_service
  start_service configs/score-gpu.yaml $OUT/serve_$run.log
  python3 -m loadtest.loadgen single --requests 300 --no-progress --out $OUT/single_$run.json | grep single
  stop_service
done
