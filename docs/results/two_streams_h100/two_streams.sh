# Two streams over half-batches: GPU tests (new ones included), then the engine bench A/B.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import tokenizers, torch, flashinfer; print('tokenizers', tokenizers.__version__, 'torch', torch.__version__, 'flashinfer', flashinfer.__version__)"
git log --oneline -1 2>/dev/null
python3 scripts/make_random_model.py > /dev/null 2>&1
timeout 300 python3 -m pytest tests/gpu -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log | grep -v "^$\|Loading\|graphs vs eager" | tail -12
timeout 270 python3 -m loadtest.bench_engine --modes engine,two_streams --out $OUT/bench_engine.json 2>&1 | grep -v Warn | tee $OUT/bench_engine.log | tail -20
