"""Rerank requests at Cohere's limits over HTTP, on the GPU service (configs/score-gpu.yaml).

Usage: python -m loadtest.bench_long_rerank [--config score-gpu.yaml] [--repeats 3]
       [--out docs/results/long_rerank_h100/long_rerank.json] [--commit SHA]

Starts the service (tools/service.py), then sends each shape once to warm up and `--repeats`
times timed, one at a time, to /v2/rerank: `many_short` is 10,000 documents of about 64
tokens, `long` 100 documents of about 8,000 tokens, `chunked` 10 documents of about 40,000
tokens (scored in chunks of the window). Texts are natural words (tools/workload.py), so token
counts are approximate: `usage.total_tokens` of the answer is recorded. Prints one line per
shape; writes JSON with the GPU, commit and command.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

from tools import git_commit, gpu_name
from tools.configs import shipped_yaml
from tools.service import serving
from tools.workload import WORDS

SHAPES = {"many_short": (10_000, 64), "long": (100, 8_000), "chunked": (10, 40_000)}
QUERY_WORDS = 20


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="score-gpu.yaml", help="a file under configs/")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path,
                   default=Path("docs/results/long_rerank_h100/long_rerank.json"))
    p.add_argument("--commit", help="the commit measured (default: git HEAD)")
    args = p.parse_args()
    rng = random.Random(0)
    results = {}
    with serving(shipped_yaml(args.config)) as service, \
            httpx.Client(base_url=service.url, timeout=120) as client:
        for name, (documents, words) in SHAPES.items():
            body = {"query": text(rng, QUERY_WORDS), "top_n": 10,
                    "documents": [text(rng, words) for _ in range(documents)]}
            seconds, answer = [], None
            for attempt in range(args.repeats + 1):
                started = time.perf_counter()
                r = client.post("/v2/rerank", json=body)
                elapsed = time.perf_counter() - started
                if r.status_code != 200:
                    sys.exit(f"{name}: {r.status_code} {r.text[:500]}\nservice log:\n"
                             f"{service.log[-3000:]}")
                answer = r.json()
                if attempt:  # the first one warms up
                    seconds.append(elapsed)
            results[name] = {"documents": documents, "words_per_document": words,
                             "total_tokens": answer["usage"]["total_tokens"],
                             "best_chunks_reported": sum("best_chunk" in x
                                                         for x in answer["results"]),
                             "seconds": [round(s, 3) for s in seconds],
                             "median_s": round(statistics.median(seconds), 3)}
            print(f"{name:12s} {documents:6d} docs × {words:6d} words: "
                  f"{answer['usage']['total_tokens']:9d} tokens, median "
                  f"{results[name]['median_s']:.3f} s")
    commit = args.commit or git_commit()
    gpu = gpu_name()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "gpu": gpu, "commit": commit, "config": args.config,
        "command": "python -m loadtest.bench_long_rerank " + " ".join(sys.argv[1:]),
        "shapes": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
