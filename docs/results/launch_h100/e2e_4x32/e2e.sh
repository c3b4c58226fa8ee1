# Where loading the weights goes (cProfile), then the HTTP end-to-end run of the shipped GPU config.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null 2>&1
python3 - <<'PY' 2>&1 | grep -v Warn | head -30
import cProfile, pstats, time, torch
torch.zeros(1, device="cuda")
from gpu_worker.loader import load_model
t = time.perf_counter()
cProfile.run('load_model("models/qwen3-0.6b-random", torch.bfloat16, torch.device("cuda"))', "/tmp/load.prof")
print("load_model s", round(time.perf_counter() - t, 2))
pstats.Stats("/tmp/load.prof").sort_stats("tottime").print_stats(12)
PY
OUT=$OUT timeout 500 bash loadtest/run_e2e_gpu.sh 230,250,270 220,240,260 2>&1 | grep -v "Warning\|warn" | tail -24
