"""Offline GPU throughput of the engine on the SGLang multi-item bench workload.

Usage: python loadtest/bench_engine.py [--requests 512] [--model models/qwen3-0.6b-random]
       [--modes engine,sync,bf16_residual,one_per_item,torch_ops,fa3] [--no-hf]

Workload: per request a 120-token query and 10 items of 180 tokens, random real-vocabulary ids
(seeded, different per request), labels 9454/2753; Qwen3-0.6B shape, bf16. All requests are
queued to the scheduler, which packs them by its token budget; items/s = items / wall time.
In the same run: HF transformers (bf16, SDPA, one sequence per item, batched), the bf16 matmul
rate on the model's linear shapes, FlashInfer multi-item attention time per layer, and the
resulting compute ceiling. Prints one table; writes JSON to loadtest/results/bench_engine.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpu_worker.engine import Engine, ScoreTask  # noqa: E402
from gpu_worker.loader import load_model  # noqa: E402
from gpu_worker.scheduler import Scheduler  # noqa: E402
from ranker_contract.config import EngineConfig, SchedulerConfig  # noqa: E402
from ranker_contract.packing import pack_multi_item, pack_plain  # noqa: E402

LABELS = [9454, 2753]
VOCAB = 151643


def make_requests(n, query_len, items, item_len, seed):
    rng = random.Random(seed)
    toks = lambda k: [rng.randrange(VOCAB) for _ in range(k)]  # noqa: E731
    return [(toks(query_len), [toks(item_len) for _ in range(items)]) for _ in range(n)]


def run_scheduler(engine, sequences, budget, overlap, timing=False):
    """Seconds to score every sequence through the real scheduling loop, and GPU idle share."""
    done = threading.Semaphore(0)
    failures: list[BaseException] = []

    def on_done(result):
        if isinstance(result, BaseException):
            failures.append(result)
        done.release()

    scheduler = Scheduler(engine, SchedulerConfig(max_batch_tokens=budget, max_batch_sequences=4096,
                                                  overlap=overlap))
    engine.step_events = [] if timing else None
    for seq in sequences:
        scheduler.submit(ScoreTask(seq, LABELS, on_done))
    torch.cuda.synchronize()
    start = time.perf_counter()
    scheduler.start()
    for _ in sequences:
        done.acquire()
    seconds = time.perf_counter() - start
    scheduler.stop()
    if failures:
        raise RuntimeError(f"{len(failures)} sequences failed") from failures[0]
    idle = None
    if timing and engine.step_events:
        events = engine.step_events
        busy = sum(s.elapsed_time(e) for s, e in events)
        total = events[0][0].elapsed_time(events[-1][1])
        idle = 1 - busy / total
    engine.step_events = None
    return seconds, scheduler.batches_run, idle


def hf_items_per_s(path, requests, batch_items):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    seqs = [q + item for q, items in requests for item in items]
    def run(chunk):
        with torch.inference_mode():
            out = hf(torch.tensor(chunk, device="cuda"), use_cache=False, logits_to_keep=1)
            torch.log_softmax(out.logits[:, -1].float(), -1)[:, LABELS].cpu()
    run(seqs[:batch_items])  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(0, len(seqs), batch_items):
        run(seqs[i:i + batch_items])
    torch.cuda.synchronize()
    rate = len(seqs) / (time.perf_counter() - start)
    del hf
    torch.cuda.empty_cache()
    return rate


def time_cuda(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2] / 1e3  # median seconds


def matmul_rate(cfg, tokens):
    """bf16 TFLOP/s over the model's four linear shapes at `tokens` rows."""
    h, q, kv, f = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, \
        cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    shapes = [(h, q + 2 * kv), (q, h), (h, 2 * f), (f, h)]
    flops = seconds = 0.0
    for k, n in shapes:
        a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        seconds += time_cuda(lambda: torch.nn.functional.linear(a, w))
        flops += 2 * tokens * k * n
    return flops / seconds / 1e12, flops / tokens  # rate, linear FLOPs per token per layer


def attention_seconds(engine, sequences):
    """FlashInfer multi-item attention for one layer over `sequences`, median seconds."""
    cfg = engine.model.config
    attn = engine.attention
    keep = attn.plan(sequences, torch.bfloat16)  # noqa: F841 - alive while timing
    t = sum(s.num_tokens for s in sequences)
    q = torch.randn(t, cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, cfg.num_key_value_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return time_cuda(lambda: attn(q, k, v))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "qwen3-0.6b-random")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--query-len", type=int, default=120)
    p.add_argument("--items", type=int, default=10)
    p.add_argument("--item-len", type=int, default=180)
    p.add_argument("--budget", type=int, default=65536, help="scheduler max_batch_tokens")
    p.add_argument("--modes", default="engine,sync,bf16_residual,one_per_item,torch_ops,fa3")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "loadtest" / "results" / "bench_engine.json")
    args = p.parse_args()
    modes = args.modes.split(",")

    device = torch.device("cuda")
    model = load_model(args.model, torch.bfloat16, device)
    cfg = model.config
    requests = make_requests(args.requests, args.query_len, args.items, args.item_len, seed=0)
    multi = [pack_multi_item(q, items, 0) for q, items in requests]
    n_items = args.requests * args.items
    warm = multi[: max(1, args.budget // multi[0].num_tokens)]
    results, table = {}, []

    def bench(name, engine, sequences, overlap=True, timing=False):
        run_scheduler(engine, warm, args.budget, overlap)  # compile + warm
        seconds, batches, idle = run_scheduler(engine, sequences, args.budget, overlap, timing)
        results[name] = {"items_per_s": n_items / seconds, "seconds": seconds,
                         "batches": batches, "gpu_idle_share": idle}
        table.append((name, n_items / seconds, batches, idle))

    def engine_with(**kw):
        return Engine(model, device, EngineConfig(device="cuda", dtype="bfloat16",
                                                  attention="flashinfer", ops="cuda").model_copy(update=kw))

    fast = engine_with()
    bench("engine", fast, multi, timing=True)
    if "sync" in modes:
        bench("sync (overlap off)", fast, multi, overlap=False, timing=True)
    if "one_per_item" in modes:
        plain = [pack_plain(q + item, 0) for q, items in requests for item in items]
        bench("one sequence per item", fast, plain)
    if "torch_ops" in modes:
        bench("torch element-wise ops", engine_with(ops="torch"), multi)
    if "bf16_residual" in modes:
        bench("bf16 residual stream", engine_with(fp32_residual=False), multi)
    if "fa3" in modes:
        bench("fa3 attention", engine_with(flashinfer_backend="fa3"), multi)

    tokens_per_request = multi[0].num_tokens
    rate, linear_flops_per_token_layer = matmul_rate(cfg, args.budget // 2)
    batch = multi[: args.budget // tokens_per_request]
    attn_s = attention_seconds(fast, batch)
    linear_s_per_request = (linear_flops_per_token_layer * cfg.num_hidden_layers
                            * tokens_per_request / (rate * 1e12))
    attn_s_per_request = attn_s * cfg.num_hidden_layers / len(batch)
    ceiling = args.items / (linear_s_per_request + attn_s_per_request)
    hf = None if args.no_hf else hf_items_per_s(args.model, requests[:64], batch_items=64)

    engine_rate = results["engine"]["items_per_s"]
    out = {
        "engine_items_per_s": engine_rate,
        "hf_items_per_s": hf,
        "ceiling_items_per_s": ceiling,
        "speedup_vs_hf": engine_rate / hf if hf else None,
        "share_of_ceiling": engine_rate / ceiling,
        "matmul_tflops": rate,
        "attention_ms_per_layer": attn_s * 1e3,
        "attention_batch_requests": len(batch),
        "modes": results,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python " + " ".join(sys.argv),
        "workload": vars(args) | {"model": str(args.model), "out": str(args.out),
                                  "tokens_per_request": tokens_per_request, "labels": LABELS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(f"\n{'mode':28s} {'items/s':>9s} {'batches':>8s} {'gpu idle':>9s}")
    for name, ips, batches, idle in table:
        print(f"{name:28s} {ips:9.0f} {batches:8d} {'' if idle is None else f'{idle:8.1%}':>9s}")
    print(f"HF transformers (bf16, 1 seq/item): {hf and round(hf)} items/s; matmul {rate:.0f} "
          f"TFLOP/s; MIS attention {attn_s * 1e3:.2f} ms/layer for {len(batch)} requests; "
          f"ceiling {ceiling:.0f} items/s")
    print(f"bench_engine: engine {engine_rate:.0f} items/s = {engine_rate / ceiling:.0%} of ceiling"
          + (f", {engine_rate / hf:.2f}x HF" if hf else "") + f" on {out['gpu']}")


if __name__ == "__main__":
    main()
