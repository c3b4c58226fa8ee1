# Start and stop the Serve app on the GPU machine; sourced by run_e2e_gpu.sh and run_scale_gpu.sh.
# There `serve` is not on PATH, so the CLI is called through Python.

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
