"""Where an idle request's time goes, from the Server-Timing header of /v1/score.

Usage: python loadtest/timing_probe.py [--url http://127.0.0.1:8000] [--requests 100]
       [--query-len 0 --items 10 --item-len 300 --vocab 151643 --labels 9454,2753]

Sends sequential requests (random token ids, seeded) and reports p50/p99 of: the client's
latency, the ingress's total, and its parts (parse + validation, tokenize, pack,
worker = handle hop + queue + forward). client − ingress = HTTP proxy and the network.
Prints one line; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--query-len", type=int, default=0)
    p.add_argument("--items", type=int, default=10)
    p.add_argument("--item-len", type=int, default=300)
    p.add_argument("--vocab", type=int, default=151643)
    p.add_argument("--labels", default="9454,2753")
    p.add_argument("--out", type=Path, default=REPO / "loadtest" / "results" / "timing_probe.json")
    args = p.parse_args()
    rng = random.Random(0)
    samples: dict[str, list[float]] = {}
    for i in range(args.requests + 5):
        body = {"query": [rng.randrange(args.vocab) for _ in range(args.query_len)],
                "items": [[rng.randrange(args.vocab) for _ in range(args.item_len)]
                          for _ in range(args.items)],
                "label_token_ids": [int(x) for x in args.labels.split(",")]}
        req = urllib.request.Request(f"{args.url}/v1/score", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            header = resp.headers["Server-Timing"]
        client_ms = (time.perf_counter() - started) * 1e3
        if i < 5:
            continue  # warm-up
        parts = {k.strip(): float(v) for k, v in (x.split(";dur=") for x in header.split(","))}
        parts["client"] = client_ms
        parts["outside ingress"] = client_ms - parts["ingress"]
        for name, ms in parts.items():
            samples.setdefault(name, []).append(ms)
    summary = {name: {"p50": percentile(v, 50), "p99": percentile(v, 99)}
               for name, v in samples.items()}
    out = {"workload": vars(args) | {"out": str(args.out)}, "ms": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print("timing_probe p50 ms: " + ", ".join(f"{k} {v['p50']:.1f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
