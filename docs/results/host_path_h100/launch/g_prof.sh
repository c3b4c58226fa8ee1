source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 scripts/make_random_model.py > /dev/null 2>&1
PYTHONPATH=.device/base:.:$PYTHONPATH timeout 120 python3 .device/launch_host.py base3 prof 2>&1 | grep -v Warn | grep -v "^$" | head -40
PYTHONPATH=.:$PYTHONPATH timeout 120 python3 .device/launch_host.py new3 prof 2>&1 | grep -v Warn | grep -v "^$" | head -40
