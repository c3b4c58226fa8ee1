"""Where an idle request's time goes, from the Server-Timing header of /v1/score.

Usage: python -m loadtest.timing_probe [--url http://127.0.0.1:8000] [--requests 100]
       [--query-len 0 --items 10 --item-len 300 --vocab 151643 --labels 9454,2753 --text natural]

Sends sequential requests (tools/workload.py, seeded) and reports p50/p99 of: the client's
latency, the ingress's total, and its parts (parse + validation, tokenize, pack, worker; the
worker call split by the scorer into hop = the handle call both ways, queue = the wait for the
first batch, compute = launch to results). client − ingress = HTTP proxy and the network.
Prints one line; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from tools import RESULTS_DIR
from tools.cli_args import add_workload_args, workload_from_args
from tools.stats import percentile
from tools.workload import RequestFactory

WARMUP_REQUESTS = 5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    add_workload_args(p, query_len=0, items=10, item_len=300)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "timing_probe.json")
    args = p.parse_args()
    workload = workload_from_args(args)
    factory = RequestFactory(workload, args.seed)
    samples: dict[str, list[float]] = {}
    for i in range(args.requests + WARMUP_REQUESTS):
        req = urllib.request.Request(f"{args.url}/v1/score", data=factory.next_bytes(),
                                     headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            header = resp.headers["Server-Timing"]
        client_ms = (time.perf_counter() - started) * 1e3
        if i < WARMUP_REQUESTS:
            continue
        parts = {k.strip(): float(v) for k, v in (x.split(";dur=") for x in header.split(","))}
        parts["client"] = client_ms
        parts["outside ingress"] = client_ms - parts["ingress"]
        for name, ms in parts.items():
            samples.setdefault(name, []).append(ms)
    summary = {name: {"p50": percentile(v, 50), "p99": percentile(v, 99)}
               for name, v in samples.items()}
    out = {"workload": workload.describe() | {"requests": args.requests, "url": args.url,
                                              "seed": args.seed},
           "ms": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print("timing_probe p50 ms: " + ", ".join(f"{k} {v['p50']:.1f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
