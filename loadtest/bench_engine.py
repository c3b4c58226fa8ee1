"""Offline GPU throughput of the engine on the SGLang multi-item bench workload.

Usage: python -m loadtest.bench_engine [--requests 512] [--model models/qwen3-0.6b-random]
       [--budget 65536] [--no-hf]
       [--modes engine,sync,one_per_item,fp8,fp8_bf16_o,classifier,classifier_from_labels,lora,
                lora_fp8,deterministic]
       [--classifier-model models/qwen3-0.6b-cls-random] [--fp8-settings no_down,edges2]
       [--commit SHA]

Engine and scheduler are built from configs/score-gpu.yaml the way a scorer replica builds them
(Engine.from_config, then the batch budget from gpu_worker/forward/startup.py::measure_budget);
--model and --budget (scheduler.max_batch_tokens; the YAML's by default) override it, and each mode
changes one engine or scheduler setting of it. Workload (tools/workload.py, seed 0): per request a
120-token query and 10 items of 180 tokens, random real-vocabulary ids, different per request,
labels 9454/2753. All requests are queued to the scheduler, which packs them by its token budget;
items/s = items / wall time. In the same run: HF transformers (loadtest/hf_baseline.py: bf16, SDPA,
one sequence per item, batched), the bf16 matmul rate on the model's linear shapes, FlashInfer
multi-item attention time per layer, and the resulting compute ceiling. Prints one table; writes
JSON to docs/results/bench_engine.json.

The `classifier` mode scores the same sequences, in the same run and with the same engine
settings and batch budget, on a *ForSequenceClassification folder of the same decoder shape
(--classifier-model; `python -m tools.random_model --shape 0.6b-cls` makes the 0.6B
one): its head at the score rows (every class) against the causal model's LM head and
full-vocabulary log-sum-exp (the "engine" row). `classifier_from_labels` serves --model itself
with its two label rows as a one-class head (rerank.classifier_from_labels), the labels being
the workload's two. `--fp8-settings` adds one fp8 engine per setting of the fidelity tool
(which linears, bf16 edge layers): the speed column of its report.

The `lora` mode builds the shipped engine with LORA_ADAPTERS adapter slots of rank LORA_RANK,
loads random rank-LORA_RANK adapters of all seven projections into them, and scores the same
requests with one adapter on every request, then with the adapters mixed uniformly (request k
on adapter k mod 16), then without any (the base through the adapter-ready linears); it times
a lone request, launch to scores, with and without an adapter (median of LONE_REPS; each
replays its CUDA graph); and an adapter's first use: a peft folder (rank LORA_RANK, all seven
projections, written by peft at start) named by a lone request while every slot is full,
submit to scores through the scheduling loop, which reads it from disk and loads it in place
of the least recently used (median of 3). `lora_fp8` does the same on the shipped engine with
precision fp8 (the adapters' deltas in bf16), its base row being that FP8 engine's.

The `deterministic` mode prices deterministic scores (engine.deterministic, on in the shipped
config): the shipped engine built with it off, bf16 and (without graphs, as the fp8 row) fp8,
on the same sequences, and a lone 1-item request timed on the shipped engine and the one with it
off (median of LONE_REPS, each a graph replay).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

from gpu_worker.forward.engine import Engine, Step
from gpu_worker.forward.startup import measure_budget
from gpu_worker.model.lora import Adapter, LoraPair, load_adapter, part_sizes
from gpu_worker.serving.adapter_slots import AdapterSlots
from gpu_worker.serving.scheduler import Scheduler, ScoreTask
from loadtest.hf_baseline import HFBaseline
from ranker_contract.config import EngineConfig, LoraConfig, SchedulerConfig
from ranker_contract.packing import PackedSequence, pack_multi_item, pack_plain
from tools import REPO_ROOT, RESULTS_DIR, git_commit
from tools.configs import shipped_app_config
from tools.fidelity import parse_setting
from tools.random_model import SHAPES
from tools.workload import RequestFactory, Workload

CONFIG = "score-gpu.yaml"
# mode -> the engine settings it changes (the "engine" mode runs the shipped ones)
ENGINE_MODES = {
    "fp8": ("fp8 W8A8", {"precision": "fp8"}),
    "fp8_bf16_o": ("fp8, o_proj in bf16", {"precision": "fp8", "fp8": {
        "linears": ("qkv_proj", "gate_up_proj", "down_proj")}}),
}
LORA_ADAPTERS, LORA_RANK, LONE_REPS = 16, 16, 50


def without_graphs(engine_cfg: EngineConfig, **update) -> EngineConfig:
    """The settings of every engine the bench builds after the shipped one: `update` applied,
    no CUDA graphs. Its batches are budget-sized and launched behind another (the last, small
    one too), so a graph never replays here, and capturing them would only cost start-up time.
    Validated: model_copy(update=...) alone would skip EngineConfig's checks."""
    return EngineConfig.model_validate(engine_cfg.model_dump() | update
                                       | {"cuda_graphs": {"enabled": False}})


class StepTimer:
    """An engine as the scheduler uses it (launch, finish) with a CUDA event pair around every
    launch, started before the host prepares the batch: the GPU's busy time per step."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.asynchronous = engine.asynchronous
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def launch(self, sequences: list[PackedSequence], label_ids_per_sequence: list[list[int]],
               **options) -> Step:
        started, done = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        started.record()
        step = self.engine.launch(sequences, label_ids_per_sequence, **options)
        done.record()  # after everything launch() queued, like the step's own `done`
        self.events.append((started, done))
        return step

    def finish(self, step: Step) -> list[list[list[float]]]:
        return self.engine.finish(step)

    def idle_share(self) -> float:
        """Share of the time from the first launch to the last step's end with no step queued."""
        busy = sum(s.elapsed_time(e) for s, e in self.events)
        return 1 - busy / self.events[0][0].elapsed_time(self.events[-1][1])


def run_scheduler(engine: Engine | StepTimer, sequences, cfg: SchedulerConfig, budget: int,
                  labels: list[int], adapters: list[int] | None = None,
                  slots: AdapterSlots | None = None) -> tuple[float, int]:
    """Seconds to score every sequence through the real scheduling loop, and batches run.
    `adapters`: per sequence, its LoRA adapter's slot (None: the base model for all), or with
    `slots` the adapter as a request names it."""
    done = threading.Semaphore(0)
    failures: list[BaseException] = []

    def on_done(result):
        if isinstance(result, BaseException):
            failures.append(result)
        done.release()

    scheduler = Scheduler(engine, cfg, batch_token_budget=budget, adapters=slots)
    for k, seq in enumerate(sequences):
        scheduler.submit(ScoreTask(seq, labels, on_done, adapter=adapters[k] if adapters else 0))
    torch.cuda.synchronize()
    start = time.perf_counter()
    scheduler.start()
    for _ in sequences:
        done.acquire()
    seconds = time.perf_counter() - start
    scheduler.stop()
    if failures:
        raise RuntimeError(f"{len(failures)} sequences failed") from failures[0]
    return seconds, scheduler.batches_run


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
        seconds += time_cuda(lambda a=a, w=w: torch.nn.functional.linear(a, w))
        flops += 2 * tokens * k * n
    return flops / seconds / 1e12, flops / tokens  # rate, linear FLOPs per token per layer


def attention_seconds(engine, sequences):
    """The engine's attention (FlashInfer, shipped settings) for one layer over `sequences`, median
    seconds."""
    cfg = engine.model.config
    # FlashInfer under the shipped engine settings; the plan holds its tensors while timing
    attn = engine.attention.plan(sequences, torch.bfloat16)
    t = sum(s.num_tokens for s in sequences)
    q = torch.randn(t, cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, cfg.num_key_value_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return time_cuda(lambda: attn(q, k, v, layer=0))


def bench_classifier(folder: Path, engine_cfg: EngineConfig, causal_cfg, sequences,
                     bench) -> None:
    """The classifier mode: the same sequences on a classifier of the causal model's shape,
    every class of its head scored, the same engine settings and batch budget."""
    from ranker_contract.model_config import ModelConfig

    if not (folder / "config.json").is_file():
        sys.exit(f"no classifier at {folder}: python -m tools.random_model --shape "
                 "0.6b-cls (or pass --classifier-model)")
    head_cfg = ModelConfig.from_folder(folder)
    if not head_cfg.is_classifier:
        sys.exit(f"{folder} is not a *ForSequenceClassification folder")
    decoder = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size")
    if any(getattr(head_cfg, k) != getattr(causal_cfg, k) for k in decoder):
        sys.exit(f"{folder}'s decoder shape differs from --model's: the rows would not compare")
    torch.cuda.empty_cache()
    engine = Engine.from_config(folder, engine_cfg)
    bench("classification head", engine, sequences, timing=True,
          labels=list(range(head_cfg.num_labels)))
    del engine
    torch.cuda.empty_cache()


def random_adapter(cfg, rank: int, seed: int, device: torch.device) -> Adapter:
    """An adapter of every decoder projection at `rank` (per part), random values: speed only."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sizes = part_sizes(cfg)
    inputs = {"qkv_proj": cfg.hidden_size, "o_proj": cfg.num_attention_heads * cfg.head_dim,
              "gate_up_proj": cfg.hidden_size, "down_proj": cfg.intermediate_size}
    pairs = {}
    for layer in range(cfg.num_hidden_layers):
        for name, parts in sizes.items():
            r = rank * len(parts)
            a = torch.randn(r, inputs[name], generator=gen, device=device) / inputs[name] ** 0.5
            b = torch.randn(sum(parts), r, generator=gen, device=device) / r
            pairs[(layer, name)] = LoraPair(a.to(dtype), b.to(dtype))
    return Adapter(Path(f"random-{seed}"), rank, pairs, None)


def lone_request_ms(engine: Engine, sequence: PackedSequence, labels: list[int],
                    adapter: int) -> float:
    """Median launch-to-scores time of one request alone on an idle engine."""
    times = []
    for _ in range(LONE_REPS + 5):
        start = time.perf_counter()
        engine.finish(engine.launch([sequence], [labels], adapters=[adapter] if adapter else None))
        times.append(time.perf_counter() - start)
    return sorted(times[5:])[LONE_REPS // 2] * 1e3


def bench_deterministic(model: Path, engine_cfg: EngineConfig, shipped: Engine, sequences,
                        requests, labels: list[int], bench, results: dict) -> dict:
    """The deterministic mode: its rows, and the ratios of the shipped (deterministic) engine's
    items/s and lone latency to the same engine with it off."""
    off_cfg = EngineConfig.model_validate(engine_cfg.model_dump() | {"deterministic": False})
    torch.cuda.empty_cache()
    off = Engine.from_config(model, off_cfg)
    bench("bf16, deterministic off", off, sequences)
    query, items = requests[0]
    lone = pack_multi_item(query, items[:1], 0)
    out = {"lone_request_ms": lone_request_ms(shipped, lone, labels, 0),
           "lone_request_ms_off": lone_request_ms(off, lone, labels, 0)}
    del off
    out["lone_delta_ms"] = out["lone_request_ms"] - out["lone_request_ms_off"]
    out["bf16_ratio"] = (results["engine"]["items_per_s"]
                         / results["bf16, deterministic off"]["items_per_s"])
    if "fp8 W8A8" in results:  # its engine as that row's: no graphs
        torch.cuda.empty_cache()
        fp8_off = Engine.from_config(model, without_graphs(
            engine_cfg, precision="fp8", deterministic=False))
        bench("fp8, deterministic off", fp8_off, sequences)
        del fp8_off
        out["fp8_ratio"] = (results["fp8 W8A8"]["items_per_s"]
                            / results["fp8, deterministic off"]["items_per_s"])
    torch.cuda.empty_cache()
    return out


def bench_lora(model: Path, engine_cfg: EngineConfig, sched: SchedulerConfig, budget: int,
               sequences, labels: list[int], bench, name: str = "LoRA",
               base_name: str = "base") -> dict:
    """The lora mode (or lora_fp8, by `engine_cfg`), on an engine built as the shipped one with
    adapter slots (its base batches replay their graphs too); `name` and `base_name` start its
    rows' names."""
    engine = Engine.from_config(model, engine_cfg,
                                lora=LoraConfig(slots=LORA_ADAPTERS, max_rank=LORA_RANK))
    for k in range(LORA_ADAPTERS):
        engine.add_adapter(random_adapter(engine.model.config, LORA_RANK, k, engine.device))
    bench(f"{name}, 1 adapter on all", engine, sequences, timing=True,
          adapters=[1] * len(sequences))
    bench(f"{name}, {LORA_ADAPTERS} mixed", engine, sequences, timing=True,
          adapters=[k % LORA_ADAPTERS + 1 for k in range(len(sequences))])
    bench(f"{base_name}, adapters loaded", engine, sequences, timing=True)
    return {"adapters": LORA_ADAPTERS, "rank": LORA_RANK,
            "lone_request_ms": lone_request_ms(engine, sequences[0], labels, 1),
            "base_lone_request_ms": lone_request_ms(engine, sequences[0], labels, 0),
            "first_use_ms": first_use_ms(engine, model, sched, budget, sequences[0], labels)}


def first_use_ms(engine: Engine, model: Path, sched: SchedulerConfig, budget: int,
                 sequence: PackedSequence, labels: list[int]) -> float:
    """Median over 3 adapters not held (every slot full) of a lone request's submit to scores
    through the scheduling loop: the read of the peft folder, its load into the least recently
    used slot, the batch."""
    import tempfile

    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    folder = Path(tempfile.mkdtemp()) / "adapter"
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model), PeftLoraConfig(
        r=LORA_RANK, lora_alpha=LORA_RANK, init_lora_weights=False, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    peft_model.save_pretrained(folder)
    del peft_model
    cfg = engine.model.config
    held = {k: k for k in range(1, LORA_ADAPTERS + 1)}  # adapters 17, 18, 19: the folder
    slots = AdapterSlots(LORA_ADAPTERS + 3, LORA_ADAPTERS, held,
                         lambda _: load_adapter(folder, cfg, engine.dtype, torch.device("cpu")),
                         engine.put_adapter)
    times = []
    for adapter in range(LORA_ADAPTERS + 1, LORA_ADAPTERS + 4):
        seconds, _ = run_scheduler(engine, [sequence], sched, budget, labels, [adapter], slots)
        times.append(seconds * 1e3)
    return sorted(times)[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help=f"default: model_path of configs/{CONFIG}")
    p.add_argument("--requests", type=int, default=512)
    for flag, default in zip(("--query-len", "--items", "--item-len"), (120, 10, 180)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--budget", type=int,
                   help="scheduler.max_batch_tokens (default: the YAML's; 0: from free memory)")
    p.add_argument("--modes", default="engine,sync,one_per_item")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--fp8-settings", default="", help="also fp8 with each of these settings of "
                   "the fidelity tool (tools/fidelity.py), e.g. no_down,qkv_gate_up+edges2")
    p.add_argument("--classifier-model", type=Path,
                   default=REPO_ROOT / "models" / SHAPES["0.6b-cls"].folder,
                   help="the classifier mode's *ForSequenceClassification folder, of --model's "
                   "decoder shape (python -m tools.random_model --shape 0.6b-cls)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "bench_engine.json")
    p.add_argument("--commit", help="the commit measured (default: $COMMIT, else git HEAD)")
    args = p.parse_args()
    modes = args.modes.split(",")

    app = shipped_app_config(CONFIG)
    args.model = args.model or app.resolved_model_path()
    fast = Engine.from_config(args.model, app.engine)
    cfg = fast.model.config
    max_batch_tokens = app.scheduler.max_batch_tokens if args.budget is None else args.budget
    budget = measure_budget(fast, max_batch_tokens, app.limits.max_seq_tokens).tokens
    # Offline: every request is queued at once, so the service's queue-wait bound (which would
    # refuse what waits past it) is off here.
    sched = app.scheduler.model_copy(update={"max_queue_wait_s": 0})
    workload = Workload(args.query_len, args.items, args.item_len)
    labels = list(workload.labels)
    factory = RequestFactory(workload, seed=0)
    requests = [factory.token_ids() for _ in range(args.requests)]
    multi = [pack_multi_item(q, items, 0) for q, items in requests]
    n_items = args.requests * args.items
    warm = multi[: max(1, budget // multi[0].num_tokens)]
    results, table = {}, []

    def bench(name, engine, sequences, overlap=True, timing=False, labels=labels, adapters=None):
        sched_cfg = sched.model_copy(update={"overlap": overlap})
        run_scheduler(engine, warm, sched_cfg, budget, labels,
                      adapters and adapters[:len(warm)])  # compile + warm
        timer = StepTimer(engine) if timing else None
        seconds, batches = run_scheduler(timer or engine, sequences, sched_cfg, budget, labels,
                                         adapters)
        idle = timer.idle_share() if timer else None
        results[name] = {"items_per_s": n_items / seconds, "seconds": seconds,
                         "batches": batches, "gpu_idle_share": idle}
        table.append((name, n_items / seconds, batches, idle))

    bench("engine", fast, multi, timing=True)
    if "sync" in modes:
        bench("sync (overlap off)", fast, multi, overlap=False, timing=True)
    if "one_per_item" in modes:
        plain = [pack_plain(q + item, 0) for q, items in requests for item in items]
        bench("one sequence per item", fast, plain)
    variants = [ENGINE_MODES[mode] for mode in ENGINE_MODES if mode in modes]
    for setting in filter(None, args.fp8_settings.split(",")):
        variants.append((f"fp8 {setting}", {"precision": "fp8",
                                            "fp8": parse_setting(setting).model_dump()}))
    for name, update in variants:  # its own engine, built like the shipped one, freed after
        torch.cuda.empty_cache()  # room for a second copy of a large model
        engine = Engine.from_config(args.model, without_graphs(app.engine, **update))
        bench(name, engine, multi)
        del engine
        torch.cuda.empty_cache()
    if "classifier" in modes:
        bench_classifier(args.classifier_model, without_graphs(app.engine), cfg, multi, bench)
    if "classifier_from_labels" in modes:  # the same folder, its label rows as the head
        torch.cuda.empty_cache()
        yes, no = labels  # the workload's two label ids
        engine = Engine.from_config(args.model, without_graphs(app.engine),
                                    head_from_labels=(yes, no))
        bench("head from label rows", engine, multi, timing=True, labels=[0])
        del engine
        torch.cuda.empty_cache()

    deterministic = None
    if "deterministic" in modes:
        deterministic = bench_deterministic(args.model, app.engine, fast, multi, requests,
                                            labels, bench, results)

    lora = None
    if "lora" in modes:
        torch.cuda.empty_cache()
        lora = bench_lora(args.model, app.engine, sched, budget, multi, labels, bench)
    lora_fp8 = None
    if "lora_fp8" in modes:
        torch.cuda.empty_cache()
        lora_fp8 = bench_lora(args.model, app.engine.model_copy(update={"precision": "fp8"}),
                              sched, budget, multi, labels, bench, "FP8 + LoRA", "fp8 base")

    tokens_per_request = multi[0].num_tokens
    rate, linear_flops_per_token_layer = matmul_rate(cfg, budget // 2)
    batch = multi[: budget // tokens_per_request]
    attn_s = attention_seconds(fast, batch)
    linear_s_per_request = (linear_flops_per_token_layer * cfg.num_hidden_layers
                            * tokens_per_request / (rate * 1e12))
    attn_s_per_request = attn_s * cfg.num_hidden_layers / len(batch)
    ceiling = args.items / (linear_s_per_request + attn_s_per_request)
    hf = None
    if not args.no_hf:
        baseline = HFBaseline(args.model, app.engine.device, getattr(torch, app.engine.dtype))
        hf = baseline.items_per_s(requests[:64], labels, batch_items=64)
        del baseline
        torch.cuda.empty_cache()

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
        "lora": lora,
        "lora_fp8": lora_fp8,
        "deterministic": deterministic,
        "gpu": torch.cuda.get_device_name(),
        "commit": args.commit or os.environ.get("COMMIT") or git_commit(),
        "torch": torch.__version__,
        "command": " ".join(["python -m", __spec__.name, *sys.argv[1:]]),
        "workload": vars(args) | {"model": str(args.model), "out": str(args.out),
                                  "tokens_per_request": tokens_per_request, "labels": labels,
                                  "seed": 0},
        "config": {"file": f"configs/{CONFIG}", "engine": app.engine.model_dump(),
                   "scheduler": sched.model_dump() | {"batch_token_budget": budget}},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(f"\n{'mode':28s} {'items/s':>9s} {'batches':>8s} {'gpu idle':>9s}")
    for name, ips, batches, idle in table:
        print(f"{name:28s} {ips:9.0f} {batches:8d} {'' if idle is None else f'{idle:8.1%}':>9s}")
    print(f"HF transformers (bf16, 1 seq/item): {hf and round(hf)} items/s; matmul {rate:.0f} "
          f"TFLOP/s; attention {attn_s * 1e3:.2f} ms/layer for {len(batch)} requests; "
          f"ceiling {ceiling:.0f} items/s")
    for lora_name, figures in (("LoRA", lora), ("FP8 + LoRA", lora_fp8)):
        if figures:
            print(f"{lora_name} (rank {LORA_RANK}): lone request "
                  f"{figures['lone_request_ms']:.2f} ms with an adapter, "
                  f"{figures['base_lone_request_ms']:.2f} ms without; an adapter's first use "
                  f"{figures['first_use_ms']:.0f} ms")
    if deterministic:
        print(f"deterministic ÷ off: bf16 {deterministic['bf16_ratio']:.3f}, fp8 "
              f"{deterministic.get('fp8_ratio') or float('nan'):.3f}; lone request "
              f"{deterministic['lone_request_ms']:.2f} ms against "
              f"{deterministic['lone_request_ms_off']:.2f} ms")
    print(f"bench_engine: engine {engine_rate:.0f} items/s = {engine_rate / ceiling:.0%} of ceiling"
          + (f", {engine_rate / hf:.2f}x HF" if hf else "") + f" on {out['gpu']}")


if __name__ == "__main__":
    main()
