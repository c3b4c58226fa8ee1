source .device/install.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import flashinfer; print(flashinfer.__version__)"
timeout 560 python3 .device/attn_layouts.py 2>&1 | grep -v Warning | tail -30
