# Serve handle round trip (echo deployment, 3,000-id job) vs a raw Ray actor call, on the GPU host.
source .device/install.sh > /dev/null 2>&1
export RAY_USAGE_STATS_ENABLED=0
for opt in 1 0; do
  RAY_SERVE_THROUGHPUT_OPTIMIZED=$opt timeout 200 python3 .device/hop.py 2>&1 | grep "^{" | tee -a $OUT/hop.jsonl
  python3 -c "from ray.scripts.scripts import main; main()" stop --force > /dev/null 2>&1
done
