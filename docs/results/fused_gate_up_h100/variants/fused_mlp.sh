source .device/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 .device/fused_mlp_bench.py 2>&1 | grep -v "Warning\|warn"
