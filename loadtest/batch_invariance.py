"""Does an item's score depend on what it is batched with? The shipped engine scores every
(query, item) pair alone, then in other compositions, and counts the pairs whose label log-probs
are not bit for bit the lone ones (docs/BENCHMARKS.md, "Batch invariance").

Usage: python -m loadtest.batch_invariance [--config score-gpu.yaml] [--queries 20]
       [--items 10] [--out FILE] [--commit SHA]

Pairs: --queries random queries of 120 token ids (of the model's vocabulary), each with --items
random items of 180 (the bench shape), labels the bench's two. The reference: each pair as a
request of one item, the engine as a replica runs it (a CUDA graph where one fits).
Compositions, each through Engine.launch / finish:
- alone_eager: each pair alone, never replaying a graph;
- request: each query's items in one request (one sequence), alone in its batch;
- batch_of_2: two requests per batch (fits a graph of the shipped buckets);
- one_batch: every request in one batch (eager: larger than the largest graph);
- shuffled: the items of each request in another order, one batch of all.
Measured the same way: items of 1 to 31 tokens (outside the guarantee on a GPU; alone against
one request per query and one batch of all), and a prefix-cache miss then hit (each query with
its first 2 items, on an engine with the cache on) against the lone scores.
Writes per composition the pairs that differ, and the largest |Δ log-prob|, for the config's
engine as shipped (engine.deterministic on: docs/ARCHITECTURE.md, "Deterministic scores"); the
GPU suite asserts the guarantee (tests/gpu/test_gpu_batch_invariance.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import torch

from gpu_worker.forward.engine import Engine
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence, pack_multi_item
from tools import git_commit
from tools.configs import shipped_app_config
from tools.workload import Workload

QUERY_LEN, ITEM_LEN = 120, 180


def score(engine: Engine, batches: list[list[PackedSequence]], labels: list[int],
          eager: bool = False) -> list[list[list[float]]]:
    """Per sequence, in the order given: items × label log-probs."""
    out = []
    for batch in batches:
        out += engine.finish(engine.launch(batch, [labels] * len(batch), eager=eager))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="score-gpu.yaml")
    p.add_argument("--queries", type=int, default=20)
    p.add_argument("--items", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("batch_invariance.json"))
    p.add_argument("--commit", default=None)
    args = p.parse_args()
    app = shipped_app_config(args.config)
    engine = Engine.from_config(app.resolved_model_path(), app.engine)
    workload = Workload()
    labels = list(workload.labels)
    vocab = ModelConfig.from_folder(app.resolved_model_path()).vocab_size
    rng = random.Random(0)
    queries = [rng.choices(range(vocab), k=QUERY_LEN) for _ in range(args.queries)]
    items = [[rng.choices(range(vocab), k=ITEM_LEN) for _ in range(args.items)]
             for _ in range(args.queries)]

    singles = {(q, i): pack_multi_item(queries[q], [items[q][i]], 0)
               for q in range(args.queries) for i in range(args.items)}

    def alone(pairs: dict, eager: bool = False) -> dict:
        """Each packed pair of `pairs` scored as a batch of its own."""
        return {key: score(engine, [[seq]], labels, eager=eager)[0][0]
                for key, seq in pairs.items()}

    lone = alone(singles)
    requests = [pack_multi_item(queries[q], items[q], 0) for q in range(args.queries)]
    orders = [rng.sample(range(args.items), args.items) for _ in range(args.queries)]
    shuffled = [pack_multi_item(queries[q], [items[q][i] for i in orders[q]], 0)
                for q in range(args.queries)]

    def by_request(results, items: int = args.items) -> dict:
        """{(query, item): row} of one result per query, its first `items` items."""
        return {(q, i): results[q][i] for q in range(args.queries) for i in range(items)}

    # Outside the guarantee (docs/ARCHITECTURE.md, "Deterministic scores"), measured: items of
    # 1 to 31 tokens, and a prefix-cache miss and hit (each query with its first 2 items, so
    # that the query is a share of its sequence the cache keeps).
    short = {(q, i): rng.choices(range(vocab), k=rng.randint(1, 31))
             for q in range(args.queries) for i in range(args.items)}
    short_lone = alone({key: pack_multi_item(queries[key[0]], [item], 0)
                        for key, item in short.items()})
    short_requests = [pack_multi_item(queries[q], [short[q, i] for i in range(args.items)], 0)
                      for q in range(args.queries)]
    cached = Engine(engine.model, engine.device, app.engine.model_copy(
        update={"prefix_cache": app.engine.prefix_cache.model_copy(update={"tokens": 1 << 14})}))
    pairs = [pack_multi_item(queries[q], items[q][:2], 0) for q in range(args.queries)]

    outside = {
        "short_items_request": (short_lone, by_request(
            score(engine, [[r] for r in short_requests], labels))),
        "short_items_one_batch": (short_lone, by_request(
            score(engine, [short_requests], labels))),
        "prefix_cache_miss": (lone, by_request(score(cached, [[r] for r in pairs], labels), 2)),
        "prefix_cache_hit": (lone, by_request(score(cached, [[r] for r in pairs], labels), 2)),
    }
    assert cached.prefix_cache.stats.hits, "the second pass must read the cache"

    compositions = {
        "alone_eager": alone(singles, eager=True),
        "request": by_request(score(engine, [[r] for r in requests], labels)),
        "batch_of_2": by_request(score(engine, [requests[k:k + 2]
                                                for k in range(0, len(requests), 2)], labels)),
        "one_batch": by_request(score(engine, [requests], labels)),
        "shuffled": {(q, orders[q][j]): row
                     for q, rows in enumerate(score(engine, [shuffled], labels))
                     for j, row in enumerate(rows)},
    }
    rows = {}
    for name, (reference, got) in ({name: (lone, got) for name, got in compositions.items()}
                                   | outside).items():
        deltas = [max(abs(a - b) for a, b in zip(got[key], reference[key])) for key in got]
        rows[name] = {"pairs": len(deltas), "differ": sum(d > 0 for d in deltas),
                      "max_abs_logprob_delta": max(deltas)}
    device = (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    result = {"command": " ".join(["python -m loadtest.batch_invariance", *sys.argv[1:]]),
              "device": device, "commit": args.commit or os.environ.get("COMMIT") or git_commit(),
              "workload": {"queries": args.queries, "items": args.items, "query_len": QUERY_LEN,
                           "item_len": ITEM_LEN, "config": args.config,
                           "precision": app.engine.precision},
              "compositions": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{device}, {args.config}: pairs whose log-probs differ from the lone score")
    for name, r in rows.items():
        print(f"{name:22s} {r['differ']:5d} of {r['pairs']:5d}   max |Δ| "
              f"{r['max_abs_logprob_delta']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
