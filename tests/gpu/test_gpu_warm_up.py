"""After a replica's warm-up (gpu_worker/forward/startup.py::warm_up), a run of mixed request shapes
compiles nothing: no Triton kernel variant and no FlashInfer module is built on the request
path, with the prefix cache off and on (queries recur, so batches hit it).

The run happens in a fresh process (this module run with `python -m`), since Triton's and
FlashInfer's caches live for the whole process and other tests here would have filled them.
"""

import json
import random
import subprocess
import sys

import pytest

from tests.gpu.conftest import VOCAB
from tools import REPO_ROOT

SHAPES = [(2000, 20, 50), (20, 50, 20), (0, 1, 4000), (120, 10, 180), (0, 8, 300), (7, 3, 1)]
FLASHINFER_BUILDS = [0]


def count_flashinfer_builds() -> None:
    """From now on, count FlashInfer's JIT module builds in FLASHINFER_BUILDS[0]."""
    from flashinfer.jit import core

    original = core.JitSpec.build_and_load

    def counted(self, *args, **kwargs):
        FLASHINFER_BUILDS[0] += 1
        return original(self, *args, **kwargs)

    core.JitSpec.build_and_load = counted


def counters() -> dict[str, int]:
    """Monotonic counts of what makes a first batch slow: Triton kernel variants compiled,
    FlashInfer modules built, cudaMalloc calls and pinned host allocations."""
    import torch

    from gpu_worker.forward.startup import triton_variants

    device = torch.cuda.memory_stats()
    host = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    return {"triton_kernels": triton_variants(), "flashinfer_builds": FLASHINFER_BUILDS[0],
            "cuda_malloc": device.get("num_device_alloc", -1),
            "host_alloc": host.get("num_host_alloc", -1)}


@pytest.mark.parametrize("cache_tokens", [0, 65536])
def test_nothing_compiles_after_warm_up(qwen3_path, cache_tokens):
    out = subprocess.run([sys.executable, "-m", "tests.gpu.test_gpu_warm_up", str(qwen3_path),
                          str(cache_tokens)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    run = json.loads(out.stdout.strip().splitlines()[-1])
    print(run)
    assert run["warm_up"]["triton_kernels"] > 0  # the counter sees compilations
    assert run["batches"] >= 40 and run["tokens"] > 200_000
    assert run["after"]["triton_kernels"] == 0
    assert run["after"]["flashinfer_builds"] == 0
    if cache_tokens:
        assert run["hits"] > 0


def _mixed_batches(rng: random.Random, budget: int, max_seq_tokens: int):
    from ranker_contract.packing import pack_request

    queries = {shape: [[rng.randrange(VOCAB) for _ in range(shape[0])] for _ in range(3)]
               for shape in SHAPES}  # three per shape: they recur

    def request():
        shape = rng.choice(SHAPES)
        _, items, item_len = shape
        item_lens = [max(1, item_len + rng.randrange(-item_len // 4 - 1, item_len // 4 + 1))
                     for _ in range(items)]
        return pack_request(rng.choice(queries[shape]),
                            [[rng.randrange(VOCAB) for _ in range(n)] for n in item_lens],
                            item_first=False, delimiter_id=0, max_seq_tokens=max_seq_tokens,
                            max_context=1 << 30)

    for _ in range(48):
        batch, tokens, want = [], 0, rng.choice([1, 2, 8, budget])
        while tokens < want:
            seqs = request()
            if batch and tokens + sum(s.num_tokens for s in seqs) > budget:
                break
            batch += seqs
            tokens += sum(s.num_tokens for s in seqs)
        yield batch, rng.random() < 0.5  # eager, or a graph where one fits


def main(model_path: str, cache_tokens: int) -> None:
    from gpu_worker.forward.engine import Engine
    from gpu_worker.forward.startup import measure_budget, warm_up
    from tools.configs import shipped_app_config

    count_flashinfer_builds()
    app = shipped_app_config("score-gpu.yaml")
    start = counters()
    cache = app.engine.prefix_cache.model_copy(update={"tokens": cache_tokens})
    engine = Engine.from_config(model_path, app.engine.model_copy(update={"prefix_cache": cache}))
    budget = measure_budget(engine, app.scheduler.max_batch_tokens, app.limits.max_seq_tokens)
    warm_up(engine, budget.tokens, app.limits.max_seq_tokens)
    warm = counters()
    batches = tokens = 0
    for batch, eager in _mixed_batches(random.Random(0), budget.tokens,
                                            app.limits.max_seq_tokens):
        engine.finish(engine.launch(batch, [[9454, 2753]] * len(batch), eager=eager))
        batches, tokens = batches + 1, tokens + sum(s.num_tokens for s in batch)
    after = counters()
    print(json.dumps({"batches": batches, "tokens": tokens,
                      "hits": engine.prefix_cache.stats.hits if engine.prefix_cache else 0,
                      "warm_up": {k: warm[k] - start[k] for k in warm},
                      "after": {k: after[k] - warm[k] for k in after}}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
