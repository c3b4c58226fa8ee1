# One H100, shipped config (autoscaling 1..2 on tokens + demand share 0.7): when does the policy ask for a
# second replica on a ramp? (On one GPU the second replica stays pending: only the target is read.)
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 MAX_JOBS=16
export RAY_metrics_report_interval_ms=1000
source loadtest/gpu_service.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
start_service configs/score-gpu.yaml $OUT/serve.log
grep -ho "warm-up done[^\"]*" $OUT/serve.log /tmp/ray/session_latest/logs/serve/*.log 2>/dev/null | head -2
python3 -m loadtest.ramp --phases 15:50,15:100,15:150,15:180,15:210,15:240,10:50 --query-len 120 --items 10 --item-len 180 \
  --vocab 151643 --out $OUT/ramp_h100.json --plot $OUT/ramp_h100.png 2>&1 | tail -3
grep -h "demand_share" /tmp/ray/session_latest/logs/serve/controller*.log 2>/dev/null | tail -3
stop_service
