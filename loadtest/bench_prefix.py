"""The prefix cache over HTTP (GPU): cache on vs off, and affinity vs Serve's default routing.

Usage:
  python -m loadtest.bench_prefix cache [--workloads profile,pages,standard] [--caches off,on]
                                       [--text natural]
  python -m loadtest.bench_prefix routing [--rate 60] [--seconds 20]
  python -m loadtest.bench_prefix engine [--config score.yaml] [--requests 24] [--batch 1]

`cache`: for each workload of tools/workload.py's PRESETS, one `serve run` of
configs/score-gpu.yaml with the cache off and one with it on (--cache-tokens), each swept with
loadgen's open-loop ramp until P99 passes 500 ms or a request fails; records the best passing
items/s and the hit rate the scorer's metrics counted (appends to prefix.json).
`routing`: two scorer replicas sharing the GPU (num_gpus 0.5 each), cache on, `profile` at a
fixed rate: the hit rate with the prefix-affinity router, with Serve's default router
(power of two choices), and with one replica (writes routing.json).
`engine`: no HTTP, any device: the engine of --config with the cache off and on (one model),
--batch requests per launch, off and on interleaved batch by batch; records items/s of each,
their ratio, and the largest score difference between them (prefix_engine.json). With --batch
above 1 every batch launches eagerly (as a batch too large for a CUDA graph); with 1, a graph
where it fits, unless its query is cacheable.
Results in --out-dir (default docs/results/prefix_h100/); prints one line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from tools import RESULTS_DIR, git_commit, gpu_name
from tools.configs import shipped_yaml
from tools.http_client import make_session
from tools.loadgen import RateConfig, run_rate, run_sweep
from tools.prom import scrape
from tools.service import Service, deployment, start_service, stop_service
from tools.workload import PRESETS, RequestFactory, Workload

CONFIG = "score-gpu.yaml"
# Serve's own default, named explicitly to undo the affinity router that build_app sets.
DEFAULT_ROUTER = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
SWEEP = RateConfig(rate=0, duration_s=6, warmup_s=2, timeout_s=30)


def serve_env() -> str:
    """The Serve settings of this machine's environment that a run's figures depend on."""
    return " ".join(f"{name}={os.environ.get(name, '')}" for name in
                    ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED"))


def config(cache_tokens: int, scorers: int = 1, router: str | None = None) -> dict:
    doc = shipped_yaml(CONFIG)
    doc["applications"][0]["args"]["engine"]["prefix_cache"] = {"tokens": cache_tokens}
    worker = deployment(doc, "ScoreWorker")
    worker.pop("autoscaling_config", None)
    worker["num_replicas"] = scorers
    worker.setdefault("ray_actor_options", {})["num_gpus"] = 1 / scorers
    if router:
        worker["request_router_config"] = {"request_router_class": router}
    return doc


def lookups(svc: Service) -> dict[str, float]:
    found = {"hit": 0.0, "partial": 0.0, "miss": 0.0, "bypass": 0.0}
    for name, labels, value in scrape(svc.metrics_url()):
        if name == "ray_ranker_prefix_cache_lookups_total":
            found[labels["result"]] += value
    return found


def hit_rate(before: dict[str, float], after: dict[str, float]) -> float | None:
    delta = {k: after[k] - before[k] for k in after}
    total = sum(delta.values())
    return round(delta["hit"] / total, 4) if total else None


async def sweep(svc: Service, workload: Workload, start_rate: float) -> dict:
    async with make_session() as session:
        return await run_sweep(session, svc.url, workload, SWEEP, 500.0, start_rate=start_rate,
                               factor=1.4, bisect_steps=2, cooldown_s=1.0, progress=False)


async def fixed_rate(svc: Service, workload: Workload, rate: float, seconds: float) -> dict:
    async with make_session() as session:
        point, _ = await run_rate(session, svc.url, workload,
                                  replace(SWEEP, rate=rate, duration_s=seconds), progress=False)
        return point


def run_cache(args: argparse.Namespace, command: str) -> list[dict]:
    rows, gpu = [], gpu_name()
    for name in args.workloads.split(","):
        workload = Workload(**PRESETS[name], text=args.text)
        for cache in (c == "on" for c in args.caches.split(",")):
            started = time.monotonic()
            svc = start_service(config(args.cache_tokens if cache else 0))
            print(f"{name:8s} cache {'on ' if cache else 'off'}: healthy after "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            try:
                before = lookups(svc)
                result = asyncio.run(sweep(svc, workload, args.start_rate))
                best = result["best"]
                # every point of the sweep, cache off: None (nothing looked up)
                rate = hit_rate(before, lookups(svc)) if cache else None
            finally:
                stop_service(svc)
            rows.append({"gpu": gpu, "commit": args.commit, "command": command,
                         "env": serve_env(), "workload": name, "text": args.text,
                         "describe": workload.describe(),
                         "cache": cache, "cache_tokens": args.cache_tokens if cache else 0,
                         "items_per_s_at_p99_500ms": best and best["achieved_items_per_s"],
                         "p99_ms": best and best["latency_ms"]["p99"],
                         "hit_rate": rate,
                         "failures": sum(p["failed"] for p in result["points"] if p["passed"]),
                         "points": [{k: p[k] for k in ("offered_rps", "achieved_items_per_s",
                                                       "failed", "passed")}
                                    | {"p99_ms": p["latency_ms"]["p99"]}
                                    for p in result["points"]]})
            r = rows[-1]
            print(f"{name:8s} cache {'on ' if cache else 'off'}: "
                  f"{r['items_per_s_at_p99_500ms']} items/s at P99 {r['p99_ms']} ms; "
                  f"hit rate {rate}", flush=True)
    return rows


def run_routing(args: argparse.Namespace, command: str) -> dict:
    workload = Workload(**PRESETS["profile"], text=args.text)
    out = {"gpu": gpu_name(), "commit": args.commit, "command": command, "env": serve_env(),
           "replicas": 2,
           "workload": "profile", "rate": args.rate, "seconds": args.seconds,
           "cache_tokens": args.cache_tokens}
    for key, scorers, router in (("hit_rate_affinity", 2, None),
                                 ("hit_rate_default", 2, DEFAULT_ROUTER),
                                 ("hit_rate_one_replica", 1, None)):
        svc = start_service(config(args.cache_tokens // scorers, scorers, router))
        try:
            before = lookups(svc)
            point = asyncio.run(fixed_rate(svc, workload, args.rate, args.seconds))
            out[key] = hit_rate(before, lookups(svc))
            out[key.replace("hit_rate", "point")] = {
                "achieved_items_per_s": point["achieved_items_per_s"],
                "p99_ms": point["latency_ms"]["p99"], "failed": point["failed"]}
        finally:
            stop_service(svc)
        print(f"{key}: {out[key]} ({out[key.replace('hit_rate', 'point')]})", flush=True)
    return out


def run_engine(args: argparse.Namespace, command: str) -> list[dict]:
    import torch

    from gpu_worker.forward.engine import Engine
    from ranker_contract.packing import pack_request
    from tools.configs import shipped_app_config

    app = shipped_app_config(args.config)
    off = Engine.from_config(app.resolved_model_path(), app.engine)
    cache = app.engine.prefix_cache.model_copy(update={"tokens": args.cache_tokens})
    on = Engine(off.model, off.device, app.engine.model_copy(update={"prefix_cache": cache}))
    device = torch.cuda.get_device_name() if off.device.type == "cuda" else "cpu"
    rows = []
    for name in args.workloads.split(","):
        workload = Workload(**PRESETS[name], vocab=off.vocab_size, labels=(1, 2))
        factory = RequestFactory(workload, seed=name)
        warm = workload.query_repeats  # one whole query's requests, not timed
        requests = [pack_request(*factory.token_ids(), item_first=False, delimiter_id=0,
                                 max_seq_tokens=app.limits.max_seq_tokens, max_context=1 << 20)
                    for _ in range(warm + args.requests)]
        batches = [sum(requests[i:i + args.batch], [])
                   for i in range(warm, len(requests), args.batch)]
        eager = args.batch > 1
        for sequences in requests[:warm]:
            for engine in (off, on):
                engine.finish(engine.launch(sequences, [[1, 2]] * len(sequences),
                                            eager=eager))
        seconds, diff = {"off": 0.0, "on": 0.0}, 0.0
        before = on.prefix_cache.stats.lookups()
        for sequences in batches:
            got = {}
            for mode, engine in (("off", off), ("on", on)):
                if off.device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                got[mode] = engine.finish(engine.launch(sequences, [[1, 2]] * len(sequences),
                                                        eager=eager))
                seconds[mode] += time.perf_counter() - started
            diff = max(diff, *(abs(a - b) for s1, s2 in zip(got["off"], got["on"])
                               for r1, r2 in zip(s1, s2) for a, b in zip(r1, r2)))
        items = args.requests * workload.items
        rows.append({"device": device,
                     "commit": args.commit, "command": command, "config": args.config,
                     "model": str(app.model_path), "dtype": app.engine.dtype, "workload": name,
                     "describe": workload.describe(), "requests": args.requests,
                     "batch": args.batch,
                     "items_per_s_off": round(items / seconds["off"], 2),
                     "items_per_s_on": round(items / seconds["on"], 2),
                     "on_over_off": round(seconds["off"] / seconds["on"], 3),
                     "hit_rate": hit_rate(before, on.prefix_cache.stats.lookups()),
                     "max_abs_logprob_diff_on_vs_off": diff})
        r = rows[-1]
        print(f"{name:8s} engine: off {r['items_per_s_off']} items/s, on {r['items_per_s_on']} "
              f"items/s ({r['on_over_off']}x), hit rate {r['hit_rate']}, max |Δ| {diff:.1e}",
              flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("cache", "routing", "engine"))
    p.add_argument("--config", default="score.yaml", help="engine: configs/NAME")
    p.add_argument("--requests", type=int, default=24, help="engine: requests per workload")
    p.add_argument("--batch", type=int, default=1, help="engine: requests per launch")
    p.add_argument("--workloads", default="profile,pages,standard")
    p.add_argument("--text", choices=("natural",), help="send text (default: token ids)")
    p.add_argument("--cache-tokens", type=int, default=131072,
                   help="engine.prefix_cache.tokens when on (routing: split among replicas)")
    p.add_argument("--caches", default="off,on", help="cache: which runs (off, on or both)")
    p.add_argument("--start-rate", type=float, default=40.0, help="sweep: first req/s")
    p.add_argument("--rate", type=float, default=60.0, help="routing: req/s")
    p.add_argument("--seconds", type=float, default=20.0, help="routing: measured seconds")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR / "prefix_h100")
    p.add_argument("--commit", default=None, help="recorded commit (default: git's HEAD; a "
                   "copy without .git must name it)")
    args = p.parse_args(argv)
    args.commit = args.commit or git_commit()
    command = "python -m loadtest.bench_prefix " + " ".join(sys.argv[1:] if argv is None else argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.mode == "cache":
        path = args.out_dir / "prefix.json"
        rows = run_cache(args, command)
        # Rows of other workloads from earlier calls stay; these replace their own.
        done = {(r["workload"], r["text"], r["cache"]) for r in rows}
        kept = [r for r in (json.loads(path.read_text()) if path.is_file() else [])
                if (r["workload"], r["text"], r["cache"]) not in done]
        path.write_text(json.dumps(kept + rows, indent=1))
    elif args.mode == "engine":
        path = args.out_dir / "prefix_engine.json"
        path.write_text(json.dumps(run_engine(args, command), indent=1))
    else:
        path = args.out_dir / "routing.json"
        path.write_text(json.dumps(run_routing(args, command), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
