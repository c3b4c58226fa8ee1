# The engine bench on this session's gpu_worker (host-path change), with HF and the ceiling.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 400 python3 -m loadtest.bench_engine --modes engine --out $OUT/bench_engine.json 2>&1 | grep -v Warn | tail -8
