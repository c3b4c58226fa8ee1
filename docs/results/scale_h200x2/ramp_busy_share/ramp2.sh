# 2x H200: the shipped autoscaling (tokens + busy share 0.7) under a gradual ramp whose peak (400 req/s) fits two scorers.
source .device/install.sh > /dev/null 2>&1
export MAX_JOBS=32
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT timeout 570 bash loadtest/run_scale_gpu.sh auto 15:100,10:150,10:200,10:225,10:250,10:300,10:350,30:400,10:100 2>&1 | grep -v "Warning\|warn" | tail -25
