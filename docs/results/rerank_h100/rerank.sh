# /v1/rerank vs /v1/score on one GPU: the same request shape as text (120-word query + 10 documents
# of ~180 words), open-loop sweeps for items/s at P99 <= 500 ms, then the per-request overhead.
source .device/install.sh > /dev/null 2>&1
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1
python3 scripts/make_random_model.py > /dev/null 2>&1
source loadtest/gpu_service.sh
stop_service
start_service configs/score-gpu.yaml $OUT/serve.log
sweep() { python3 -m loadtest.loadgen sweep --rates 180,200,220 --duration 15 --warmup 3 --p99-ms 500 --text natural --vocab 151643 --no-progress "$@" | tail -4; }
sweep --out $OUT/sweep_score_text.json --plot $OUT/sweep_score_text.png
sweep --rerank --out $OUT/sweep_rerank_text.json --plot $OUT/sweep_rerank_text.png
python3 -m loadtest.bench_rerank --config score-gpu.yaml --pairs 200 --out $OUT/bench_rerank_gpu.json 2>&1 | tail -8
stop_service
