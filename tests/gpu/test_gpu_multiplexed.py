"""A second full model (`models`) loads in a scorer beside the model's running batches, as a
scorer replica loads one on its first request (gpu_worker/serving/deployment.py): its own engine,
budget share, CUDA graphs and warm-up, built in another thread while the first model's loop keeps
answering. Nothing of the first model fails or changes meanwhile; the second scores as the
first on the same weights; unloading it gives its GPU and host memory back, load after load."""

from __future__ import annotations

import random
import threading
import time

import psutil
import torch

from gpu_worker.serving.replica import release_memory, start_scorer
from gpu_worker.serving.scheduler import ScoreTask
from ranker_contract.config import ModelEntry
from ranker_contract.packing import pack_request
from tests.gpu.conftest import LABELS, ids, worst_difference
from tools.configs import shipped_app_config

# Graph replay of one bucket on the same weights: the same kernels, so the same scores.
SAME_GRAPH = 1e-6
LOADS = 6  # load-unload cycles of the second model


def _score(scheduler, sequence) -> list:
    done = threading.Event()
    out = {}

    def on_done(result) -> None:
        out["result"] = result
        done.set()

    scheduler.submit(ScoreTask(sequence, LABELS, on_done))
    assert done.wait(120), "no answer within 120 s"
    if isinstance(out["result"], BaseException):
        raise out["result"]
    return out["result"]


def test_a_model_loads_beside_another_models_batches(qwen3_path):
    app = shipped_app_config("score-gpu.yaml").model_copy(update={
        "model_path": str(qwen3_path),
        "models": [ModelEntry(name="second", path=str(qwen3_path))]})
    assert app.engine.cuda_graphs.enabled  # the load captures graphs while the other replays
    rng = random.Random(0)
    sequence = pack_request(ids(rng, 120), [ids(rng, 180) for _ in range(4)], item_first=False,
                            delimiter_id=0, max_seq_tokens=4096, max_context=32768)[0]
    first = start_scorer(app, memory_share=app.memory_share)
    try:
        reference = _score(first.scheduler, sequence)
        stop, answers, failures = threading.Event(), [], []

        def keep_scoring() -> None:
            while not stop.is_set():
                try:
                    answers.append(_score(first.scheduler, sequence))
                except Exception as exc:  # noqa: BLE001 - counted, asserted below
                    failures.append(exc)

        scoring = threading.Thread(target=keep_scoring)
        before_load = torch.cuda.memory_allocated()
        scoring.start()
        try:
            second = start_scorer(app.multiplexed("second"), None, app.memory_share)
        finally:
            stop.set()
            scoring.join(120)
        print(f"first model's batches during the load: {len(answers)}; budgets "
              f"{first.budget.tokens} and {second.budget.tokens} tokens")
        assert failures == []
        assert len(answers) >= 10  # it did run while the second loaded
        assert max(worst_difference([a], [reference])[0] for a in answers) <= SAME_GRAPH
        second_answer = _score(second.scheduler, sequence)
        assert worst_difference([second_answer], [reference])[0] <= SAME_GRAPH
        loaded, after, host, started = [second], [], [], time.perf_counter()
        del second
        for cycle in range(LOADS):  # unloaded, and loaded again: nothing kept per load
            loaded.pop().stop(drain_s=60)
            release_memory()
            after.append(torch.cuda.memory_allocated())
            host.append(psutil.Process().memory_info().rss)
            print(f"cycle {cycle}: host RSS {host[-1] / 2**20:.0f} MiB, "
                  f"{time.perf_counter() - started:.2f} s")  # (the first: an unload only)
            started = time.perf_counter()
            if cycle + 1 < LOADS:
                loaded.append(start_scorer(app.multiplexed("second"), None, app.memory_share))
        print(f"allocated: {before_load / 2**20:.0f} MiB before the first load, after each "
              f"unload {[round(a / 2**20) for a in after]} MiB")
        assert max(after) <= before_load + 64 * 2**20
        assert max(host) <= host[0] + 256 * 2**20  # the host keeps no copy per load either
    finally:
        first.stop(drain_s=0)
