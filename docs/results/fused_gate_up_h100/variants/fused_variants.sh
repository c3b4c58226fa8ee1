source .device/install.sh > /dev/null 2>&1
timeout 500 python3 .device/fused_variants.py 2>&1 | grep -v "Warning\|warn" | tail -40
