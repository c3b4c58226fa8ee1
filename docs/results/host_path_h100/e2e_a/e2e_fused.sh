# The HTTP end-to-end run of the shipped GPU config (token ids, text, overload, latency vs load).
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
python3 scripts/make_random_model.py > /dev/null 2>&1
OUT=$OUT timeout 580 bash loadtest/run_e2e_gpu.sh 250,260,270 245,255,265 2>&1 | grep -v "Warning\|warn" | tail -30
