# Host time of a lone launch (cProfile), and where a replica's start goes (twice: cold, warm caches).
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
python3 -m loadtest.replica_start --out $OUT/replica_start_cold.json 2>&1 | grep -v Warn | tail -9
python3 -m loadtest.replica_start --out $OUT/replica_start_warm.json 2>&1 | grep -v Warn | tail -9
timeout 300 python3 -m loadtest.engine_latency --host-profile --out $OUT/engine_latency.json 2>&1 | grep -v Warn | tail -60
