# A/B of the HTTP sweep: the tree before the restructure (.old) and the current one, same machine.
# .old was made with `git archive 2b2f07e | tar -x -C .old` and carried to the GPU machine;
# run there as: bash .device/ab.sh .old $PWD
set -u
source .device/install.sh
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 RAY_SERVE_ENABLE_HA_PROXY=1
python3 scripts/make_random_model.py > /dev/null
mkdir -p .old/models; python3 -c "import sys; print(sys.path[:3])" && ln -sfn "$PWD/models/qwen3-0.6b-random" .old/models/qwen3-0.6b-random
for tree in "$@"; do
  (cd $tree && export PYTHONPATH=$PWD:$PYTHONPATH && source loadtest/gpu_service.sh && stop_service
   start_service configs/score-gpu.yaml $OUT/serve_$(basename $tree).log
   python3 -m loadtest.loadgen sweep --rates 200,240 --duration 15 --warmup 3 --p99-ms 500 \
     --no-progress --out $OUT/sweep_$(basename $tree).json 2>&1 | grep -E "offered|best"
   grep -c "Traceback" $OUT/serve_$(basename $tree).log
   stop_service)
done
