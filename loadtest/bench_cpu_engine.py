"""CPU throughput of our engine (multi-item packing) against HF transformers on the same model.

Usage: python -m loadtest.bench_cpu_engine [--requests 20] [--threads N] [--model PATH]

The engine is built from configs/score.yaml (model, device, dtype) as the service builds it;
--threads overrides engine.torch_threads, --model the model folder. Workload per request
(tools/workload.py, seeded): a query of --query-len random token ids and --items items of
--item-len tokens, scored for the labels "Yes"/"No" (SmolLM2 ids). Compared in one process, same
model folder and dtype (HF baseline: loadtest/hf_baseline.py):
- engine: each request as one packed sequence `Q D I_1 ... D I_n D`, one request per launch;
- engine_batched: --batch-requests such sequences per launch;
- hf: one forward per query+item (the query is recomputed for every item);
- hf_batched: one [items, query+item] batch per request (equal lengths: no padding).
HF gets its best settings here: no KV cache, logits only for the last position.
Modes are interleaved request by request, so that load from other processes hits all alike.
Prints one result line; writes JSON to docs/results/bench_cpu_engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402 - after HF_HUB_OFFLINE
from tqdm import tqdm  # noqa: E402

from gpu_worker.engine import Engine  # noqa: E402
from loadtest.hf_baseline import HFBaseline  # noqa: E402
from ranker_contract.packing import pack_multi_item  # noqa: E402
from tools import REPO_ROOT, RESULTS_DIR  # noqa: E402
from tools.cli_args import add_engine_bench_args  # noqa: E402
from tools.configs import shipped_app_config  # noqa: E402
from tools.workload import RequestFactory, Workload  # noqa: E402

CONFIG = "score.yaml"
Request = tuple[list[int], list[list[int]]]  # query, items


def engine_scores(
    engine: Engine, batch: list[Request], labels: list[int]
) -> list[list[list[float]]]:
    sequences = [pack_multi_item(q, items, delimiter_id=0) for q, items in batch]
    return engine.finish(engine.launch(sequences, [labels] * len(sequences)))


def interleaved(modes: dict, groups: list[list[Request]]) -> list[tuple[str, object]]:
    """(mode, unit) in round-robin order: each group's requests through every per-request mode,
    then the group through engine_batched. Load from other processes then hits all modes alike."""
    order = []
    for group in groups:
        order += [(name, r) for r in group for name in modes if name != "engine_batched"]
        order.append(("engine_batched", group))
    return order


def run_timed(modes: dict, order: list, bar: tqdm) -> tuple[dict[str, float], dict[str, list]]:
    """Wall seconds per mode, and each mode's per-item rows in request order."""
    seconds = dict.fromkeys(modes, 0.0)
    rows: dict[str, list] = {name: [] for name in modes}
    for name, unit in order:
        started = time.perf_counter()
        rows[name] += modes[name](unit)
        seconds[name] += time.perf_counter() - started
        bar.update(1)
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_bench_args(parser, CONFIG, requests=20, shape=(100, 10, 20))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-requests", type=int, default=4)
    parser.add_argument("--labels", type=int, nargs="+", default=[10539, 5230])  # "Yes", "No"
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads (engine.torch_threads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "bench_cpu_engine.json")
    args = parser.parse_args()

    app = shipped_app_config(CONFIG)
    args.model = args.model or app.resolved_model_path()
    engine_cfg = app.engine.model_copy(update={"torch_threads": args.threads})
    engine = Engine.from_config(args.model, engine_cfg)  # also sets torch's thread count
    hf = HFBaseline(args.model, engine_cfg.device, getattr(torch, engine_cfg.dtype))
    factory = RequestFactory(Workload(args.query_len, args.items, args.item_len,
                                      tuple(args.labels), engine.vocab_size), args.seed)
    warm = [factory.token_ids() for _ in range(args.warmup)]
    reqs = [factory.token_ids() for _ in range(args.requests)]
    groups = [reqs[i : i + args.batch_requests] for i in range(0, len(reqs), args.batch_requests)]
    labels = args.labels

    modes = {  # name -> function of one unit (a request, or a group for engine_batched)
        "engine": lambda r: engine_scores(engine, [r], labels)[0],
        "engine_batched": lambda g: [x for rows in engine_scores(engine, g, labels) for x in rows],
        "hf": lambda r: hf.score_request(*r, labels, batched=False),
        "hf_batched": lambda r: hf.score_request(*r, labels, batched=True),
    }
    warm_order, order = interleaved(modes, [warm]), interleaved(modes, groups)
    load_before = os.getloadavg()
    with tqdm(total=len(warm_order) + len(order), desc="bench", unit="step") as bar:
        run_timed(modes, warm_order, bar)
        seconds, scores = run_timed(modes, order, bar)

    n_items = args.requests * args.items
    rate = {name: n_items / s for name, s in seconds.items()}
    # Same numbers from all four paths, or the comparison means nothing.
    flat = {name: [x for row in rows for x in row] for name, rows in scores.items()}
    max_diff = max(abs(a - b) for name in flat for a, b in zip(flat[name], flat["hf"], strict=True))
    result = {
        "engine_items_per_s": rate["engine"],
        "engine_batched_items_per_s": rate["engine_batched"],
        "hf_items_per_s": rate["hf"],
        "hf_batched_items_per_s": rate["hf_batched"],
        "speedup": rate["engine"] / rate["hf_batched"],  # against the stronger HF baseline
        "speedup_vs_hf_per_item": rate["engine"] / rate["hf"],
        "seconds": seconds,
        "max_abs_logprob_diff_vs_hf": max_diff,
        "command": " ".join([Path(sys.executable).name, "-m", __spec__.name, *sys.argv[1:]]),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "workload": {
            "model": str(args.model.relative_to(REPO_ROOT) if args.model.is_relative_to(REPO_ROOT)
                         else args.model),
            "dtype": engine_cfg.dtype,
            "config": f"configs/{CONFIG}",
            "requests": args.requests,
            "warmup_requests": args.warmup,
            "query_tokens": args.query_len,
            "items_per_request": args.items,
            "tokens_per_item": args.item_len,
            "labels": labels,
            "engine_requests_per_launch": {"engine": 1, "engine_batched": args.batch_requests},
            "seed": args.seed,
        },
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench_cpu_engine: engine {rate['engine']:.1f} items/s "
          f"(batched x{args.batch_requests}: {rate['engine_batched']:.1f}), "
          f"hf {rate['hf']:.1f}, hf_batched {rate['hf_batched']:.1f} items/s, "
          f"speedup {result['speedup']:.2f}x vs hf_batched, "
          f"{result['speedup_vs_hf_per_item']:.2f}x vs hf; max |dlogprob| {max_diff:.1e}; "
          f"{torch.get_num_threads()} threads -> {args.out}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
