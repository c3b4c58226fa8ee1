# 2 GPUs: the shipped autoscaling config under a ramp; how long a replica added under load takes.
source .device/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT timeout 480 bash loadtest/run_scale_gpu.sh auto 15:100,60:400,10:100 2>&1 | grep -v "Warn\|warn" | tail -8
grep -h "Upscaling\|Adding\|captured\|ScoreWorker ready\|warm-up done" $OUT/serve-auto.log | cut -c1-220 | tail -12
