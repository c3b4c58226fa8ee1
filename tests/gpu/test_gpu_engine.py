"""The GPU engine (bf16, FlashInfer) against HF fp32, against itself one item at a time, against
the torch backend, overlap against sync, and the launch path free of host syncs."""

import math
import random
import time

import pytest
import torch

from gpu_worker.engine import Engine, ScoreTask
from gpu_worker.scheduler import Scheduler
from ranker_contract.config import EngineConfig, SchedulerConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import NO, YES

LABELS = [YES, NO]


def _request(rng: random.Random, query_len=120, item_lens=(180, 1, 0, 57, 180, 3, 99, 180, 12, 30)):
    vocab = 151643  # real tokens only
    query = [rng.randrange(vocab) for _ in range(query_len)]
    return query, [[rng.randrange(vocab) for _ in range(n)] for n in item_lens]


def _run(engine: Engine, sequences, labels=LABELS):
    tasks = [ScoreTask(s, labels, lambda _: None) for s in sequences]
    return engine.finish(engine.launch(tasks))


def _softmax(row):
    top = max(row)
    w = [math.exp(x - top) for x in row]
    return [x / sum(w) for x in w]


@pytest.fixture(scope="module")
def hf_fp32(qwen3_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(qwen3_path, dtype=torch.float32).cuda().eval()


def test_parity_with_hf_fp32(fast_engine, hf_fp32):
    query, items = _request(random.Random(1))
    (ours,) = _run(fast_engine, [pack_multi_item(query, items, 0)])
    worst_lp = worst_p = 0.0
    for item, row in zip(items, ours):
        with torch.inference_mode():
            logits = hf_fp32(torch.tensor([query + item], device="cuda")).logits[0, -1]
        ref = torch.log_softmax(logits.float(), -1)[LABELS].tolist()
        worst_lp = max(worst_lp, *(abs(a - b) for a, b in zip(row, ref)))
        worst_p = max(worst_p, *(abs(a - b) for a, b in zip(_softmax(row), _softmax(ref))))
    print(f"max |Δ logprob| {worst_lp:.2e}, max |Δ softmax score| {worst_p:.2e}")
    assert worst_lp <= 5e-2 and worst_p <= 5e-3


def test_multi_item_equals_one_at_a_time(fast_engine):
    query, items = _request(random.Random(2))
    (packed,) = _run(fast_engine, [pack_multi_item(query, items, 0)])
    alone = [_run(fast_engine, [pack_plain(query + item, 0)])[0][0] for item in items]
    worst = max(abs(a - b) for r1, r2 in zip(packed, alone)
                for a, b in zip(_softmax(r1), _softmax(r2)))
    print(f"max |Δ softmax score| multi-item vs alone: {worst:.2e}")
    assert worst <= 5e-3


def test_empty_query_multi_item(fast_engine):
    """With no query, delimiter rows attend to nothing: they must not leak NaN into items."""
    _, items = _request(random.Random(6), query_len=0)
    items = [item for item in items if item]
    (packed,) = _run(fast_engine, [pack_multi_item([], items, 0)])
    alone = [_run(fast_engine, [pack_plain(item, 0)])[0][0] for item in items]
    assert all(math.isfinite(x) for row in packed for x in row)
    worst = max(abs(a - b) for r1, r2 in zip(packed, alone)
                for a, b in zip(_softmax(r1), _softmax(r2)))
    print(f"max |Δ softmax score| empty query, multi-item vs alone: {worst:.2e}")
    assert worst <= 5e-3


def test_flashinfer_equals_torch_backend(fast_engine):
    reference = Engine(fast_engine.model, fast_engine.device,
                       EngineConfig(device="cuda", attention="torch", ops="torch"))
    rng = random.Random(3)
    sequences = [pack_multi_item(*_request(rng), 0), pack_plain(_request(rng)[0], 0),
                 pack_multi_item(*_request(rng, 40, (5, 0, 300)), 0)]
    fast, slow = _run(fast_engine, sequences), _run(reference, sequences)
    worst = max(abs(a - b) for s1, s2 in zip(fast, slow) for r1, r2 in zip(s1, s2)
                for a, b in zip(r1, r2))
    print(f"max |Δ logprob| flashinfer vs torch backend (bf16): {worst:.2e}")
    assert worst <= 5e-2


def _scheduled(engine, sequences, overlap):
    results = {}
    scheduler = Scheduler(engine, SchedulerConfig(max_batch_tokens=4096, max_batch_sequences=64,
                                                  overlap=overlap))
    for i, seq in enumerate(sequences):  # all queued before start: identical batches
        scheduler.submit(ScoreTask(seq, LABELS, lambda r, i=i: results.__setitem__(i, r)))
    scheduler.start()
    try:
        for _ in range(600):
            if len(results) == len(sequences):
                break
            time.sleep(0.05)
    finally:
        scheduler.stop()
    assert scheduler.batches_run > 2
    return [results[i] for i in range(len(sequences))]


def test_overlap_bitwise_equals_sync(fast_engine):
    rng = random.Random(4)
    sequences = [pack_multi_item(*_request(rng), 0) for _ in range(12)]
    assert _scheduled(fast_engine, sequences, True) == _scheduled(fast_engine, sequences, False)


def test_launch_path_has_no_host_sync(fast_engine):
    rng = random.Random(5)
    tasks = [ScoreTask(pack_multi_item(*_request(rng), 0), LABELS, lambda _: None)
             for _ in range(4)]
    fast_engine.finish(fast_engine.launch(tasks))  # warm: first plan/JIT may allocate
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step = fast_engine.launch(tasks)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(fast_engine.finish(step)) == 4
