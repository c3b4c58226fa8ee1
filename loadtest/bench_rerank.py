"""What /v1/rerank adds over /v1/score for the same tokens, measured on a running service.

Usage: python -m loadtest.bench_rerank [--url http://127.0.0.1:8000] [--pairs 60] [--docs 10]
       [--config configs/score.yaml]

Sends pairs, one after the other: a rerank request (query + documents, rendered with the
configured template by the ingress) and the /v1/score request of the same prompt (the rendered
prefix as `query`, each document + suffix as an item, the template's yes/no ids as labels,
apply_softmax), whose token count is checked to be equal. The order within a pair alternates.
Reports p50/p99 of the client's latency and of the ingress's own time (Server-Timing: ingress −
worker, i.e. parse, tokenize, pack and the response), and the p50 difference rerank − score.
Prints a table; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from serve_app.rerank import RerankPrompter
from serve_app.tokenizer import TextTokenizer
from tools import RESULTS_DIR
from tools.configs import shipped_app_config
from tools.stats import percentile

WARMUP_PAIRS = 5
QUERY = "Which passage explains how vaccines train the immune system?"
WORDS = ("the immune system learns to recognise a harmless piece of a virus so that it can "
         "respond faster when the real infection arrives and antibodies are produced by cells "
         "in the blood while the weather in the mountains changed quickly during the "
         "afternoon").split()


def passages(n: int) -> list[str]:
    """n different ~30-word passages (deterministic)."""
    return [" ".join(WORDS[(7 * k + j) % len(WORDS)] for j in range(30)).capitalize() + "."
            for k in range(n)]


def post(url: str, body: dict) -> tuple[float, dict, dict[str, float]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        payload = json.loads(r.read())
        timing = r.headers["server-timing"]
    elapsed = time.perf_counter() - start
    parts = {name: float(v) for name, v in (p.strip().split(";dur=") for p in timing.split(","))}
    return elapsed * 1e3, payload, parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--config", default="score.yaml", help="the shipped config the service runs")
    p.add_argument("--pairs", type=int, default=60)
    p.add_argument("--docs", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "bench_rerank_cpu.json")
    args = p.parse_args()

    config = shipped_app_config(args.config)
    prompt = config.rerank.resolved_prompt()
    prompter = RerankPrompter(prompt, TextTokenizer(config.resolved_model_path()))
    docs = passages(args.docs)
    prefix, lead = prompter.render_prefix(QUERY, prompt.default_instruction)
    after = prompt.document.split("{document}")[1] + prompt.suffix
    rerank_body = {"model": "bench", "query": QUERY, "documents": docs}
    score_body = {"query": prefix, "items": [lead + d + after for d in docs],
                  "label_token_ids": prompter.label_ids, "apply_softmax": True}

    samples: dict[str, dict[str, list[float]]] = {"rerank": {}, "score": {}}
    tokens: dict[str, int] = {}
    for i in range(args.pairs + WARMUP_PAIRS):
        calls = [("rerank", "/v1/rerank", rerank_body), ("score", "/v1/score", score_body)]
        for name, route, body in calls if i % 2 == 0 else calls[::-1]:
            client_ms, payload, parts = post(args.url + route, body)
            tokens[name] = (payload["usage"]["total_tokens"])
            if i < WARMUP_PAIRS:
                continue
            for key, value in (("client", client_ms), ("ingress", parts["ingress"]),
                               ("ingress_own", parts["ingress"] - parts["worker"]),
                               ("tokenize", parts["tokenize"]), ("worker", parts["worker"])):
                samples[name].setdefault(key, []).append(value)
    if tokens["rerank"] != tokens["score"]:
        raise SystemExit(f"token counts differ: {tokens}; the comparison would be unfair")

    table = {name: {key: {"p50": round(percentile(v, 50), 3), "p99": round(percentile(v, 99), 3)}
                    for key, v in parts.items()} for name, parts in samples.items()}
    diff = {key: round(table["rerank"][key]["p50"] - table["score"][key]["p50"], 3)
            for key in table["rerank"]}
    print(f"{args.pairs} pairs, {args.docs} documents, {tokens['rerank']} tokens per request\n")
    print(f"{'ms':<12}{'score p50':>11}{'rerank p50':>12}{'Δ p50':>9}{'score p99':>11}"
          f"{'rerank p99':>12}")
    for key in table["rerank"]:
        s, r = table["score"][key], table["rerank"][key]
        print(f"{key:<12}{s['p50']:>11.3f}{r['p50']:>12.3f}{diff[key]:>+9.3f}{s['p99']:>11.3f}"
              f"{r['p99']:>12.3f}")
    result = {"pairs": args.pairs, "documents": args.docs, "tokens_per_request": tokens["rerank"],
              "ms": table, "rerank_minus_score_p50_ms": diff, "url": args.url}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
