# 2x H200: the shipped autoscaling (tokens + demand share 0.7) under a gradual ramp whose peak
# (400 req/s) fits two scorers (the same phases as the busy-share ramp of 2026-11-23); then where
# a replica's start goes, in a fresh process on the same machine (kernel caches warm).
source .device/install.sh > /dev/null 2>&1
export MAX_JOBS=32
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
OUT=$OUT timeout 450 bash loadtest/run_scale_gpu.sh auto 15:100,10:150,10:200,10:225,10:250,10:300,10:350,30:400,10:100 2>&1 | grep -v "Warning\|warn" | tail -25
timeout 90 python -m loadtest.replica_start --out $OUT/replica_start_warm.json 2>&1 | grep -v "Warning\|warn" | tail -12
