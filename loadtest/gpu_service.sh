# Shared by the GPU harnesses (gpu_checks.sh, run_e2e_gpu.sh, run_scale_gpu.sh), which source
# it from the repo root: the check of their environment, and the start and stop of the Serve app.
# On the GPU machine `serve` may not be on PATH, so the CLIs are called through python3.

require_python() {  # require_python MODULE...: exit at once, naming what is missing, unless
  # python3 imports every MODULE and torch sees a CUDA device
  python3 - "$@" <<'PY' || { echo "$0: needs the environment stated at its top" >&2; exit 1; }
import importlib, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # not installed, or a library it loads is missing
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
if missing:
    sys.exit("python3 (" + sys.executable + ") cannot import: " + "; ".join(missing))
import torch
if not torch.cuda.is_available():
    sys.exit("torch " + torch.__version__ + " sees no CUDA device")
print("python3 " + sys.version.split()[0] + ", torch " + torch.__version__ + ", "
      + torch.cuda.get_device_name())
PY
}

stop_service() {  # SIGINT is ignored by a background job: stop Serve and its Ray explicitly
  pkill -TERM -f "serve.scripts" 2>/dev/null
  python3 -c "from ray.scripts.scripts import main; main()" stop --force > /dev/null 2>&1
}

start_service() {  # start_service CONFIG LOG: `serve run` in the background, until /health is 200
  local config=$1 log=$2 started
  (setsid python3 -c "from ray.serve.scripts import cli; cli()" run "$config" > "$log" 2>&1 &)
  started=$(date +%s)
  until curl -sf -m 2 127.0.0.1:8000/health > /dev/null; do
    sleep 1
    if ! pgrep -f "serve.scripts" > /dev/null || (( $(date +%s) - started > 300 )); then
      echo "service did not become healthy"; tail -40 "$log"; stop_service; exit 1
    fi
  done
  echo "healthy after $(( $(date +%s) - started )) s"
}
