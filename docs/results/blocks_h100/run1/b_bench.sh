# Engine bench A/B on one machine: a7d9d6b (multi-item mask) then the blocks layout.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 scripts/make_random_model.py > /dev/null 2>&1
ln -sfn ../../models .device/old/models
(cd .device/old && timeout 200 python3 -m loadtest.bench_engine --modes engine --no-hf --out $OUT/old/bench_engine.json 2>&1 | grep -v Warn | tail -6)
timeout 360 python3 -m loadtest.bench_engine --modes engine,sync,fa3 --out $OUT/bench_engine.json 2>&1 | grep -v Warn | tail -10
