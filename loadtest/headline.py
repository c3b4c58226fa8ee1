"""The headline run: every figure the README claims, measured on today's code on one GPU machine,
optionally A/B against another commit in the same run (docs/BENCHMARKS.md, "Headline").

  python -m loadtest.headline [--quick [--fp8] [--lora] [--idle-cost]] [--baseline COMMIT]
                              [--parts bench,feed,prefix,long] [--commit SHA] [--out PATH]
  python -m loadtest.headline --merge PART.json PART.json ... [--out PATH]

What it measures, on the shipped configs/score-gpu.yaml of each tree (its own file, its own code):
- the engine offline (loadtest/bench_engine.py of that tree: bf16, fp8, the in-run ceiling; the
  full set adds LoRA: 1 adapter and 16 mixed ÷ the base engine, and the prefix cache on ÷ off
  on the `profile` workload, loadtest/bench_prefix.py's engine mode);
- over HTTP, every tree served at once from one Ray cluster on the same GPU, each application
  under its own route prefix (/head, /base; the full set adds an FP8 application per tree):
  - a sporadic lone request (tools/loadgen.py::run_sporadic: constant 2 req/s per tree, sent
    A B A B, the service idle before each), 1 item and 10 items of 180 tokens after a 120-token
    query, as text, with the Server-Timing stages;
  - a text sweep (bench shape: 120-token query + 10 items × 180 tokens, natural words) at
    fixed shares of the tree's engine rate: the highest items/s with P99 ≤ 500 ms and 0
    failures, and the share of the engine rate where the first 503 came;
  - P99 at half of that capacity (Poisson arrivals);
  - goodput past capacity, this tree only (a device call's time): the items/s answered at
    OVERLOAD multiples of the sweep's best rate, each ÷ the items/s at that rate
    (tools/loadgen.py::run_overload);
  - full set only: rerank at Cohere's limits (10,000 × 64 and 100 × 8,000 words);
  - with LoRA (`--lora` or the full set): an application per tree serving one rank-16 peft
    adapter of all seven projections (written here with peft), and on it a sporadic lone
    request of the bench shape with the adapter and without, A B A B: `lora_lone_delta_ms` is
    the p50 with it less the p50 without;
  - load control's idle cost (`--idle-cost` or the full set): an application per tree with
    `scheduler.max_queue_wait_s: 0` (nothing refused, so nothing shed), and a sporadic lone
    1-item request on the shipped application and on that one, A B A B:
    `load_control_idle_cost_ms` is the p50 with load control less the p50 without;
  - with the FP8 applications (`--fp8` or the full set): a sporadic lone 1-item request on each
    tree's bf16 and FP8 applications, A B A B: `fp8_lone_delta_ms` is FP8's p50 less bf16's.
The engine rows also give `engine_lone_ms`, a lone 1-item request on the shipped engine from
launch to scores (bench_engine's deterministic mode), and goodput past capacity gives
`p99_answered_{M}x_ms`, the P99 of the requests answered (not refused) at each multiple M.
The workloads come in parts (`--parts`, default `bench`), each fitting one device call:
- `bench`: every row above (the bench shape, and the rest of the quick or full set);
- `feed`: the feed shape (FEED: a 300-token query and 100 items of 10 tokens, as a recommendation
  slate), in the engine (bench_engine of each tree on that shape: items/s, and deterministic
  scores ÷ off) and over HTTP (a text sweep at shares of that tree's feed engine rate, as the
  bench sweep: the highest items/s with P99 ≤ 500 ms and 0 failures);
- `prefix`: long queries with reuse (PREFIX: tools/workload.py's `profile`, a 2,000-word query
  sent 4 times within about a second, each time with 20 fresh items of 50 words, as text), on
  each tree's application and on one with the prefix cache on (PREFIX_CACHE_TOKENS): a ramp of
  rates on each (loadgen's run_sweep: ×1.4 from PREFIX_START_RPS, then 2 bisections), the best
  items/s with P99 ≤ 500 ms and 0 failures, `prefix_reuse_ratio` = cache on ÷ off;
- `long`: rerank at Cohere's limits (as the full set's rows).
`--merge` joins part runs of the same commit and baseline into one JSON: each figure from the
first part that measured it, the diff made again, every part's command kept.
Each tree's scorer gets 1/N of the GPU's share (`num_gpus`) and one replica (no autoscaling: one
GPU holds them all); its batch budget is the YAML's cap, far under its memory share.

`--baseline COMMIT` measures that commit's tree too (.ab/COMMIT, made with `git archive` where
missing: on the GPU machine, carry it) and writes `baseline_figures` and `diff`, a row per figure
flagged as a regression when items/s fall 3% or more, or a latency grows by 1 ms and 10% or more.
`--quick` (engine bf16/fp8, the bf16 sweep, the sporadic rows, half load, overload) fits two
trees in one 10-minute device call; `--fp8` adds the FP8 applications' sweeps to it, `--lora` the
engine's LoRA rows (about 40 s a tree) and the adapter applications' lone requests,
`--idle-cost` the applications without load control.
Writes one JSON (top-level gpu, commit, command, baseline, figures, baseline_figures, diff,
start, details) and prints the diff table last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tools import REPO_ROOT, git_commit, gpu_name
from tools.http_client import make_session
from tools.loadgen import RateConfig, run_overload, run_rate, run_sporadic, run_sweep
from tools.service import LocalServer, free_port, serve_cli, stop_service
from tools.workload import Workload

CONFIG = "configs/score-gpu.yaml"  # every tree's own; --config: another (configs/score.yaml: CPU)
MODEL = REPO_ROOT / "models" / "qwen3-0.6b-random"  # python -m tools.random_model; or --model
TREES = REPO_ROOT / ".ab"  # baseline trees, one folder per commit (ignored by git)
RESULT = REPO_ROOT / "docs" / "results" / "headline" / "headline.json"
VOCAB = 151643  # the Qwen3 tokenizer's: text words and token ids both fit it
BENCH = dict(query_len=120, items=10, item_len=180)
FEED = dict(query_len=300, items=100, item_len=10)  # the `feed` part's shape
FEED_REQUESTS = 128  # bench_engine's requests of the feed shape (12,800 items)
PREFIX = dict(query_len=2000, items=20, item_len=50, query_repeats=4)  # PRESETS["profile"]
PREFIX_CACHE_TOKENS = 262144  # as docs/BENCHMARKS.md's "Prefix cache" measured it
PREFIX_START_RPS = 60.0  # the ramp's first rate: about half the cache-off capacity on one H200
PARTS = ("bench", "feed", "prefix", "long")
LONE_ITEM_TOKENS = 180
ADAPTER = "headline-lora"  # the name requests give the adapter application's adapter
ADAPTER_RANK = 16
P99_BOUND_MS = 500.0
SWEEP_SHARES = (0.85, 0.92, 0.97, 1.02)  # of the tree's engine rate
OVERLOAD = (1.2, 1.5, 3.0)  # multiples of the sweep's best rate
DEFAULT_CAPACITY_ITEMS_PER_S = 2500.0  # where the engine was not measured (no GPU)
DEFAULT_FEED_CAPACITY_ITEMS_PER_S = 16000.0  # the same, of the feed shape
START_TIMEOUT_S = 300
# figure -> True where higher is better; every key the headline JSON's `figures` holds
FIGURES = {
    "engine_bf16_items_per_s": True, "engine_fp8_items_per_s": True,
    "ceiling_items_per_s": True, "lora_1_adapter_ratio": True, "lora_16_mixed_ratio": True,
    "lora_lone_delta_ms": False,
    "http_text_bf16_items_per_s": True, "http_text_fp8_items_per_s": True,
    "first_refusal_share_bf16": True, "first_refusal_share_fp8": True,
    "sporadic_lone_1item_p50_ms": False, "sporadic_lone_1item_p99_ms": False,
    "sporadic_lone_10item_p50_ms": False, "sporadic_lone_10item_p99_ms": False,
    "p99_at_half_load_ms": False, "load_control_idle_cost_ms": False,
    "goodput_1.2x_ratio": True, "goodput_1.5x_ratio": True, "goodput_3x_ratio": True,
    "long_10000x64_s": False, "long_100x8000_s": False,
    "prefix_profile_ratio": True, "service_start_s": False,
    "deterministic_bf16_ratio": True, "deterministic_fp8_ratio": True,
    "deterministic_lone_delta_ms": False,
    "feed_engine_items_per_s": True, "feed_http_items_per_s": True,
    "feed_deterministic_ratio": True, "prefix_reuse_ratio": True,
    "engine_lone_ms": False, "fp8_lone_delta_ms": False,
    "p99_answered_1.2x_ms": False, "p99_answered_1.5x_ms": False, "p99_answered_3x_ms": False,
}
LONG_SHAPES = {"long_10000x64_s": (10_000, 64), "long_100x8000_s": (100, 8_000)}
# measures of the machine or of the run, not of the code: in the diff, never a regression
NOT_FLAGGED = {"ceiling_items_per_s", "service_start_s"}


@dataclass(frozen=True)
class Tree:
    label: str  # its route prefix and its key in the JSON: "head" or "base"
    path: Path
    commit: str


@dataclass(frozen=True)
class App:
    tree: Tree
    precision: str  # "bf16" or "fp8"
    adapter: Path | None = None  # a peft folder served as ADAPTER (bf16 only)
    load_control: bool = True  # False: scheduler.max_queue_wait_s 0 (bf16 only)
    prefix_cache: bool = False  # True: engine.prefix_cache on, PREFIX_CACHE_TOKENS (bf16 only)

    @property
    def name(self) -> str:
        if self.adapter is not None:
            return f"{self.tree.label}-lora"
        if not self.load_control:
            return f"{self.tree.label}-nolc"
        if self.prefix_cache:
            return f"{self.tree.label}-cache"
        return self.tree.label if self.precision == "bf16" else f"{self.tree.label}-fp8"


def baseline_tree(commit: str) -> Path:
    """`.ab/COMMIT`: the commit's files (git archive), made here when missing."""
    path = TREES / commit
    if not (path / CONFIG).is_file():
        path.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], cwd=REPO_ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path


# ---- the engine, offline --------------------------------------------------------------------

def tree_env(tree: Tree) -> dict[str, str]:
    """The environment a benchmark of `tree` runs in: its code first, its commit recorded."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(
        [str(tree.path), *filter(None, [os.environ.get("PYTHONPATH")])]), "COMMIT": tree.commit}


def prefix_figure(tree: Tree, out_dir: Path) -> dict:
    """bench_prefix's engine mode of `tree` on the `profile` workload (eager batches of 8, as
    docs/BENCHMARKS.md's "Prefix cache" measures it): {"prefix_profile_ratio": on ÷ off}, or {}
    where it failed."""
    out = out_dir / f"prefix_{tree.label}"
    env = tree_env(tree)
    run = subprocess.run([sys.executable, "-m", "loadtest.bench_prefix", "engine", "--config",
                          Path(CONFIG).name, "--requests", "64", "--batch", "8", "--workloads",
                          "profile", "--commit", tree.commit, "--out-dir", str(out)],
                         cwd=tree.path, env=env, capture_output=True, text=True)
    result = out / "prefix_engine.json"
    print(f"[{tree.label}] bench_prefix engine: rc {run.returncode}", flush=True)
    if run.returncode != 0 or not result.is_file():
        print(run.stdout[-1500:], run.stderr[-3000:], sep="\n")
        return {}
    return {"prefix_profile_ratio": json.loads(result.read_text())[0]["on_over_off"]}


def bench_engine(tree: Tree, modes: str, out: Path, *extra: str) -> dict | None:
    """bench_engine of `tree`, run from its folder on the shared model: its JSON, or None where
    it failed."""
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "loadtest.bench_engine", "--modes", modes,
                          "--no-hf", "--model", str(MODEL), *extra, "--out", str(out)],
                         cwd=tree.path, env=tree_env(tree), capture_output=True, text=True)
    print(f"[{tree.label}] bench_engine ({modes}{' ' + ' '.join(extra) if extra else ''}): "
          f"{time.monotonic() - started:.0f} s, rc {run.returncode}", flush=True)
    if run.returncode != 0 or not out.is_file():
        print(run.stdout[-1500:], run.stderr[-3000:], sep="\n")
        return None
    return json.loads(out.read_text())


def feed_engine_figures(tree: Tree, out_dir: Path) -> dict:
    """The feed shape in `tree`'s engine: items/s, and deterministic scores (shipped) ÷ off;
    {} where it failed."""
    doc = bench_engine(tree, "engine,deterministic", out_dir / f"feed_engine_{tree.label}.json",
                       "--query-len", str(FEED["query_len"]), "--items", str(FEED["items"]),
                       "--item-len", str(FEED["item_len"]), "--requests", str(FEED_REQUESTS))
    if doc is None:
        return {}
    ratio = (doc.get("deterministic") or {}).get("bf16_ratio")
    return {"feed_engine_items_per_s": round(doc["engine_items_per_s"], 1),
            "feed_deterministic_ratio": ratio and round(ratio, 4)}


def engine_figures(tree: Tree, lora: bool, out_dir: Path) -> dict:
    """The bench shape in `tree`'s engine (`lora`: its LoRA rows too): its figures, or {} where
    it failed."""
    doc = bench_engine(tree, "engine,fp8,deterministic" + (",lora" if lora else ""),
                       out_dir / f"engine_{tree.label}.json")
    if doc is None:
        return {}
    modes_run = doc.get("modes", {})
    base = doc["engine_items_per_s"]

    def rate(name: str) -> float | None:
        return modes_run.get(name, {}).get("items_per_s")

    def ratio(name: str) -> float | None:
        value = rate(name)
        return round(value / base, 4) if value else None

    return {"engine_bf16_items_per_s": round(base, 1),
            "engine_fp8_items_per_s": rate("fp8 W8A8") and round(rate("fp8 W8A8"), 1),
            "ceiling_items_per_s": round(doc["ceiling_items_per_s"], 1),
            "lora_1_adapter_ratio": ratio("LoRA, 1 adapter on all"),
            "lora_16_mixed_ratio": ratio("LoRA, 16 mixed"),
            # a lone 1-item request on the shipped engine, launch to scores (a graph replay)
            "engine_lone_ms": (doc.get("deterministic") or {}).get("lone_request_ms") and round(
                doc["deterministic"]["lone_request_ms"], 3),
            **{f"deterministic_{key}": round(value, 4)
               for key, value in (doc.get("deterministic") or {}).items()
               if key in ("bf16_ratio", "fp8_ratio", "lone_delta_ms")}}


# ---- the service: every tree's application on one Ray cluster -------------------------------

def combined_config(apps: list[App], port: int) -> dict:
    """One Serve config holding each app's tree's own configs/score-gpu.yaml application,
    renamed and prefixed by the app's name, on the shared model, sharing the GPU."""
    doc = yaml.safe_load((REPO_ROOT / CONFIG).read_text())
    doc["http_options"]["port"] = port
    cpus = max(1, (os.cpu_count() or 16) - 2)  # some for the load generator
    wanted, entries = 0.0, []
    for app in apps:
        entry = yaml.safe_load((app.tree.path / CONFIG).read_text())["applications"][0]
        entry.update(name=app.name, route_prefix=f"/{app.name}")
        entry["args"]["model_path"] = str(MODEL)
        entry["args"]["served_model_name"] = MODEL.name
        if app.precision != "bf16":
            entry["args"]["engine"]["precision"] = app.precision
        if app.adapter is not None:
            entry["args"]["adapters"] = [{"name": ADAPTER, "path": str(app.adapter)}]
        if not app.load_control:
            entry["args"].setdefault("scheduler", {})["max_queue_wait_s"] = 0
        if app.prefix_cache:
            entry["args"]["engine"]["prefix_cache"] = {"tokens": PREFIX_CACHE_TOKENS}
        # Its replicas import its own code: `serve run` starts outside every tree (start()).
        entry.setdefault("runtime_env", {})["working_dir"] = f"local://{app.tree.path}"
        for dep in entry["deployments"]:
            options = dep.setdefault("ray_actor_options", {})
            if dep["name"] == "ScoreWorker":
                options["num_gpus"] = options.get("num_gpus", 0) and 1 / len(apps)
                dep.pop("autoscaling_config", None)
                dep["num_replicas"] = 1
            wanted += options.get("num_cpus", 1) * dep.get("num_replicas", 1)
        entries.append(entry)
    scale = min(1.0, cpus / wanted)  # Ray's CPU count is logical: fit every replica in
    for entry in entries:
        for dep in entry["deployments"]:
            options = dep["ray_actor_options"]
            options["num_cpus"] = round(options.get("num_cpus", 1) * scale, 3)
    doc["applications"] = entries
    return doc


@dataclass
class Running(LocalServer):
    """`serve run` of every tree's applications (its log: LocalServer.LOG_FILE)."""

    healthy_s: dict[str, float] = field(default_factory=dict)  # app -> s to its /health 200


def start(apps: list[App]) -> Running:
    """`serve run` of every app; returns once all are healthy, or at START_TIMEOUT_S with those
    that are (none: RuntimeError)."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="headline-"))
    (workdir / "headline.yaml").write_text(yaml.safe_dump(combined_config(apps, port)))
    env = os.environ | {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                        "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    # Serve's controller imports this tree's request router (ranker_app) outside any app's
    # runtime_env; each app's replicas put their own tree first (working_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    with open(workdir / Running.LOG_FILE, "w") as log:
        proc = subprocess.Popen([*serve_cli(), "run", str(workdir / "headline.yaml")],
                                cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    running = Running(f"http://127.0.0.1:{port}", proc, workdir)
    started = reported = time.monotonic()
    while len(running.healthy_s) < len(apps) and time.monotonic() - started < START_TIMEOUT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"serve run exited ({proc.returncode}):\n{running.log[-4000:]}")
        for app in apps:
            if app.name not in running.healthy_s and _healthy(f"{running.url}/{app.name}"):
                running.healthy_s[app.name] = round(time.monotonic() - started, 1)
        if time.monotonic() - reported > 60:
            reported = time.monotonic()
            status = subprocess.run([*serve_cli(), "status"], capture_output=True, text=True,
                                    timeout=30, env=env)
            states = re.findall(r"^\s*(\w+):\s*\n?\s*status: (\w+)", status.stdout, re.M)
            print(f"{reported - started:.0f} s: healthy {running.healthy_s}; serve status "
                  f"{states or status.stdout[-600:]}", flush=True)
        time.sleep(1.0)
    if not running.healthy_s:
        stop_service(running)
        raise RuntimeError(f"no application healthy after {START_TIMEOUT_S} s")
    return running


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def service_logs(running: Running, path: Path) -> None:
    """The ends of `serve run`'s log and of every Serve log of this session, in one file."""
    parts = [("serve run", running.log)]
    parts += [(p.name, p.read_text(errors="replace"))
              for p in sorted(Path("/tmp/ray/session_latest/logs/serve").glob("*.log"))]
    path.write_text("".join(f"==== {name}\n" + "\n".join(text.splitlines()[-80:]) + "\n"
                            for name, text in parts))


def start_breakdown(apps: list[App]) -> dict:
    """Where each scorer's start went, from gpu_worker/forward/startup.py's log lines: they reach
    the stderr file of the replica's worker process, which Ray heads with the actor's name."""
    logs = Path("/tmp/ray/session_latest/logs")
    out = {}
    for app in apps:
        texts = (p.read_text(errors="replace") for p in logs.glob("worker-*.err"))
        text = "".join(t for t in texts if f"ServeReplica:{app.name}:ScoreWorker" in t)
        warm = re.findall(r"warm-up batches ran in ([\d.]+) s", text)
        budget = re.findall(r"batch budget (\d+) tokens", text)
        out[app.name] = {"warm_up_batches_s": float(warm[-1]) if warm else None,
                         "batch_budget_tokens": int(budget[-1]) if budget else None}
    return out


# ---- the HTTP figures -----------------------------------------------------------------------

def text_workload(**shape) -> Workload:
    return Workload(text="natural", vocab=VOCAB, **shape)


async def lone_requests(url: str, apps: list[App], items: int, requests: int) -> dict:
    workload = text_workload(query_len=BENCH["query_len"], items=items,
                             item_len=LONE_ITEM_TOKENS)
    async with make_session() as session:
        results = await run_sporadic(session, [f"{url}/{a.name}" for a in apps], workload,
                                     rate=2.0 * len(apps), requests=requests, progress=False,
                                     seed=f"lone{items}")
    for app, res in zip(apps, results):
        lat = res["latency_ms"]
        print(f"[{app.name}] sporadic {items} item(s): idle {res['idle']} busy {res['busy']} "
              f"failed {res['failed']} | p50 {lat['p50']} p99 {lat['p99']} ms | stages p50 "
              + ", ".join(f"{k} {v['p50']}" for k, v in res["stages_ms"].items()), flush=True)
    return {a.name: r for a, r in zip(apps, results)}


def write_adapter(folder: Path) -> Path:
    """A random rank-ADAPTER_RANK peft adapter of every decoder projection of MODEL (peft's own
    save_pretrained): what a LoRA request costs does not depend on its values."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(MODEL), LoraConfig(
        r=ADAPTER_RANK, lora_alpha=2 * ADAPTER_RANK, init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"]))
    model.save_pretrained(folder)
    return folder


async def lone_pairs(url: str, pairs: dict[str, tuple[tuple[str, Workload], ...]],
                     requests: int, seed: str) -> dict:
    """A lone request on both sides of each pair, without a feature and with it (each side an
    application name and its workload), A B A B, pair after pair: {pair key: {"without":
    result, "with": result}}."""
    sides = [side for pair in pairs.values() for side in pair]
    async with make_session() as session:
        results = await run_sporadic(session, [f"{url}/{name}" for name, _ in sides],
                                     [workload for _, workload in sides],
                                     rate=2.0 * len(sides), requests=requests, progress=False,
                                     seed=seed)
    out = {}
    for k, key in enumerate(pairs):
        without, with_ = results[2 * k], results[2 * k + 1]
        out[key] = {"without": without, "with": with_}
        print(f"[{key}] {seed}, without / with: p50 {without['latency_ms']['p50']} / "
              f"{with_['latency_ms']['p50']} ms, failed {without['failed']} / "
              f"{with_['failed']}", flush=True)
    return out


def delta_ms(result: dict) -> float | None:
    """p50 with the feature less p50 without, where both were measured and none failed."""
    without, with_ = result["without"], result["with"]
    if without["failed"] or with_["failed"] or None in (without["latency_ms"]["p50"],
                                                        with_["latency_ms"]["p50"]):
        return None
    return round(with_["latency_ms"]["p50"] - without["latency_ms"]["p50"], 3)


async def sweep(url: str, app: App, capacity_items_per_s: float, shares: list[float],
                seconds: float, shape: dict = BENCH, seed: str = "sweep") -> dict:
    """A text sweep of `shape` at `shares` of `capacity_items_per_s`."""
    workload = text_workload(**shape)
    rates = [round(share * capacity_items_per_s / shape["items"], 1) for share in shares]
    cfg = RateConfig(0.0, duration_s=seconds, warmup_s=3.0, seed=seed)  # alike for each tree
    async with make_session() as session:
        res = await run_sweep(session, f"{url}/{app.name}", workload, cfg, P99_BOUND_MS,
                              rates=rates, progress=False,
                              report=lambda line: print(f"[{app.name}] {line}", flush=True))
    refused = [p["offered_items_per_s"] for p in res["points"] if p["failures"].get("503")]
    best = res["best"]
    return {"rates": rates, "points": res["points"], "best": best,
            "items_per_s": best and round(best["achieved_items_per_s"], 1),
            "best_rps": best and best["offered_rps"],
            # where the first 503 came, as a share of the engine's rate; no refusal at any
            # rate: the highest share offered (a lower bound, said in `first_refusal_seen`)
            "first_refusal_share": round(min(refused) / capacity_items_per_s, 3) if refused
            else round(max(p["offered_items_per_s"] for p in res["points"])
                       / capacity_items_per_s, 3),
            "first_refusal_seen": bool(refused)}


async def reuse_sweep(url: str, app: App, quick: bool) -> dict:
    """The `prefix` part's ramp on one application: its points, the best passing one and its
    items/s."""
    cfg = RateConfig(0.0, duration_s=6.0 if quick else 10.0, warmup_s=2.0, seed="reuse")
    async with make_session() as session:
        res = await run_sweep(session, f"{url}/{app.name}", text_workload(**PREFIX), cfg,
                              P99_BOUND_MS, start_rate=PREFIX_START_RPS, factor=1.4,
                              bisect_steps=2, cooldown_s=1.0, progress=False,
                              report=lambda line: print(f"[{app.name}] {line}", flush=True))
    best = res["best"]
    return {**res, "items_per_s": best and round(best["achieved_items_per_s"], 1)}


async def overload(url: str, app: App, rps: float, multiples: list[float]) -> dict:
    cfg = RateConfig(rps, duration_s=10.0, warmup_s=3.0, seed="overload")
    async with make_session() as session:
        res = await run_overload(session, f"{url}/{app.name}", text_workload(**BENCH), cfg, rps,
                                 [1.0, *multiples], progress=False,
                                 report=lambda line: print(f"[{app.name}] {line}", flush=True))
    at_capacity = res["capacity_items_per_s"]
    res["goodput_ratios"] = {
        f"goodput_{m:g}x_ratio": round(p["goodput_items_per_s"] / at_capacity, 3)
        if at_capacity else None for m, p in zip(multiples, res["overload"][1:])}
    # the P99 of the requests answered (not refused) at each multiple
    res["answered_p99"] = {f"p99_answered_{m:g}x_ms": p["accepted_p99_ms"]
                           for m, p in zip(multiples, res["overload"][1:])}
    return res


async def half_load(url: str, app: App, rps: float) -> dict:
    cfg = RateConfig(rps / 2, duration_s=10.0, warmup_s=3.0, seed="half")
    async with make_session() as session:
        point, _ = await run_rate(session, f"{url}/{app.name}", text_workload(**BENCH), cfg,
                                  progress=False)
    print(f"[{app.name}] half load {rps / 2:.1f} req/s: p50 {point['latency_ms']['p50']} "
          f"p99 {point['latency_ms']['p99']} ms, failed {point['failed']}", flush=True)
    return point


def long_rerank(url: str, app: App) -> dict:
    import random

    from loadtest.bench_long_rerank import QUERY_WORDS, text

    rng, out = random.Random(0), {}
    with httpx.Client(base_url=f"{url}/{app.name}", timeout=300) as client:
        for key, (documents, words) in LONG_SHAPES.items():
            body = {"query": text(rng, QUERY_WORDS), "top_n": 10,
                    "documents": [text(rng, words) for _ in range(documents)]}
            times = []
            for attempt in range(3):  # the first warms up
                started = time.perf_counter()
                r = client.post("/v2/rerank", json=body)
                if r.status_code != 200:
                    print(f"[{app.name}] {key}: {r.status_code} {r.text[:300]}")
                    break
                if attempt:
                    times.append(time.perf_counter() - started)
            out[key] = round(sorted(times)[0], 3) if times else None
    return out


# ---- the run ---------------------------------------------------------------------------------

def diff_rows(figures: dict, baseline: dict) -> list[dict]:
    """One row per figure both runs measured; `regression` per the module docstring."""
    rows = []
    for key, higher_better in FIGURES.items():
        new, old = figures.get(key), baseline.get(key)
        if new is None or old is None:
            continue
        change = (new - old) / old if old else 0.0
        if key in NOT_FLAGGED:
            regression = False
        elif higher_better:
            regression = change <= -0.03
        else:
            regression = new - old >= 1.0 and change >= 0.10 if key.endswith("_ms") \
                else change >= 0.10
        rows.append({"figure": key, "new": new, "baseline": old,
                     "change": round(change, 4), "regression": regression})
    return rows


def measure(trees: list[Tree], quick: bool, fp8: bool, lora: bool, out_dir: Path,
            lone_requests_n: int,
            figures: dict, details: dict, logs: Path, capacity: dict[str, float] | None,
            sweep_shares: list[float], overload_multiples: list[float],
            measured: Callable[[], object] = lambda: None, idle_cost: bool = False,
            parts: tuple[str, ...] = ("bench",)) -> None:
    """Every figure of `parts` (PARTS) of every tree into `figures` ({label: {figure: value}}),
    the details behind them into `details`, as they come (a run cut short keeps what it
    measured). `capacity`: per precision (and `feed`), the items/s the sweeps refer to where the
    engine rows are skipped (None: measure them)."""
    bench = "bench" in parts
    for tree in trees:
        if capacity is None and gpu_name() != "unknown":
            if bench:
                figures[tree.label].update(engine_figures(tree, lora or not quick, out_dir))
            if bench and not quick:
                figures[tree.label].update(prefix_figure(tree, out_dir))
            if "feed" in parts:
                figures[tree.label].update(feed_engine_figures(tree, out_dir))
    apps = [App(t, "bf16") for t in trees]
    if bench and (fp8 or not quick):
        apps += [App(t, "fp8") for t in trees]
    if bench and (lora or not quick):
        adapter = write_adapter(out_dir / "adapter")
        apps += [App(t, "bf16", adapter) for t in trees]
    if bench and (idle_cost or not quick):
        apps += [App(t, "bf16", load_control=False) for t in trees]
    if "prefix" in parts:
        apps += [App(t, "bf16", prefix_cache=True) for t in trees]
    running = start(apps)
    print(f"healthy after (s): {running.healthy_s}", flush=True)
    apps = [a for a in apps if a.name in running.healthy_s]
    try:
        for tree in trees:
            figures[tree.label]["service_start_s"] = running.healthy_s.get(tree.label)
            details[tree.label]["start"] = start_breakdown([a for a in apps if a.tree is tree])
        cached = {a.tree.label: a for a in apps if a.prefix_cache}
        apps = [a for a in apps if not a.prefix_cache]
        plain = [a for a in apps if a.precision == "bf16" and a.adapter is None
                 and a.load_control]  # each tree's shipped application
        if bench:
            bench_rows(trees, apps, quick, lone_requests_n, figures, details, running, capacity,
                       sweep_shares, overload_multiples)
        if "feed" in parts:
            for app in plain:
                figs = figures[app.tree.label]
                engine = (figs["feed_engine_items_per_s"] or (capacity or {}).get("feed")
                          or DEFAULT_FEED_CAPACITY_ITEMS_PER_S)
                res = asyncio.run(sweep(running.url, app, engine, sweep_shares,
                                        10.0 if quick else 15.0, FEED, "feed-sweep"))
                details[app.tree.label]["feed_sweep_bf16"] = res
                figs["feed_http_items_per_s"] = res["items_per_s"]
        if "prefix" in parts:
            for app in [a for a in plain if a.tree.label in cached]:
                off = asyncio.run(reuse_sweep(running.url, app, quick))
                on = asyncio.run(reuse_sweep(running.url, cached[app.tree.label], quick))
                details[app.tree.label]["prefix_reuse"] = {"off": off, "on": on}
                figures[app.tree.label]["prefix_reuse_ratio"] = (
                    round(on["items_per_s"] / off["items_per_s"], 3)
                    if on["items_per_s"] and off["items_per_s"] else None)
        if "long" in parts:
            for app in plain:
                figures[app.tree.label].update(long_rerank(running.url, app))
    finally:
        measured()  # written before the service stops: a stop that hangs loses nothing
        service_logs(running, logs)
        stop_service(running)


def bench_rows(trees: list[Tree], apps: list[App], quick: bool, lone_requests_n: int,
               figures: dict, details: dict, running: Running,
               capacity: dict[str, float] | None, sweep_shares: list[float],
               overload_multiples: list[float]) -> None:
    """The `bench` part's HTTP rows on the running service."""
    lora_apps = [a for a in apps if a.adapter is not None]
    no_control = [a for a in apps if not a.load_control]
    fp8_apps = [a for a in apps if a.precision == "fp8"]
    apps = [a for a in apps if a.adapter is None and a.load_control]  # the sweeps' ones
    bf16 = [a for a in apps if a.precision == "bf16"]
    for items in (1, 10):
        lone = asyncio.run(lone_requests(running.url, bf16, items, lone_requests_n))
        for app in bf16:
            res = lone[app.name]
            details[app.tree.label][f"sporadic_{items}item"] = res
            key = f"sporadic_lone_{items}item"
            figures[app.tree.label][f"{key}_p50_ms"] = res["latency_ms"]["p50"]
            figures[app.tree.label][f"{key}_p99_ms"] = res["latency_ms"]["p99"]
    bench = text_workload(**BENCH)
    lone = text_workload(query_len=BENCH["query_len"], items=1, item_len=LONE_ITEM_TOKENS)
    # figure, its details' key, its applications, and each one's sides (without, with)
    for figure, detail, chosen, sides in (
            ("lora_lone_delta_ms", "sporadic_lora", lora_apps, lambda a: (
                (a.name, bench), (a.name, text_workload(**BENCH, model=ADAPTER)))),
            ("load_control_idle_cost_ms", "sporadic_load_control", no_control,
             lambda a: ((a.name, lone), (a.tree.label, lone))),
            ("fp8_lone_delta_ms", "sporadic_fp8", fp8_apps,
             lambda a: ((a.tree.label, lone), (a.name, lone)))):
        if not chosen:
            continue
        paired = asyncio.run(lone_pairs(running.url, {a.name: sides(a) for a in chosen},
                                        lone_requests_n, detail))
        for app in chosen:
            details[app.tree.label][detail] = paired[app.name]
            figures[app.tree.label][figure] = delta_ms(paired[app.name])
    for app in apps:
        label, figs = app.tree.label, figures[app.tree.label]
        engine = (figs[f"engine_{app.precision}_items_per_s"]
                  or (capacity or {}).get(app.precision) or DEFAULT_CAPACITY_ITEMS_PER_S)
        res = asyncio.run(sweep(running.url, app, engine, sweep_shares,
                                10.0 if quick else 15.0))
        details[label][f"sweep_{app.precision}"] = res
        figs[f"http_text_{app.precision}_items_per_s"] = res["items_per_s"]
        figs[f"first_refusal_share_{app.precision}"] = res["first_refusal_share"]
        if app.precision == "bf16" and res["best_rps"]:
            point = asyncio.run(half_load(running.url, app, res["best_rps"]))
            details[label]["half_load"] = point
            figs["p99_at_half_load_ms"] = point["latency_ms"]["p99"]
        if (app.precision == "bf16" and res["best_rps"] and app.tree is trees[0]
                and overload_multiples):
            over = asyncio.run(overload(running.url, app, res["best_rps"],
                                        overload_multiples))
            details[label]["overload"] = over
            figs.update(over["goodput_ratios"])
            figs.update({k: v for k, v in over["answered_p99"].items() if k in FIGURES})
    if not quick:
        for app in bf16:
            figures[app.tree.label].update(long_rerank(running.url, app))


def merge_parts(docs: list[dict]) -> dict:
    """One headline JSON from part runs (`--parts`) of one commit and baseline: each figure
    the first part's that measured it, the diff made again from the merged figures, every
    part's command in `command` and each part's own record in `parts`."""
    first = docs[0]
    for doc in docs[1:]:
        for key in ("commit", "baseline", "gpu"):
            if doc[key] != first[key]:
                raise ValueError(f"parts of different runs: {key} {first[key]!r} and "
                                 f"{doc[key]!r}")

    def merged(key: str) -> dict | None:
        if first.get(key) is None:
            return None
        out = dict.fromkeys(FIGURES)
        for doc in docs:
            for name, value in (doc.get(key) or {}).items():
                if out.get(name) is None:
                    out[name] = value
        return out

    figures, baseline = merged("figures"), merged("baseline_figures")
    details: dict = {}
    for doc in docs:
        for label, part in (doc.get("details") or {}).items():
            for key, value in part.items():  # as the figures: the first part's
                details.setdefault(label, {}).setdefault(key, value)
    return {"gpu": first["gpu"], "commit": first["commit"], "baseline": first["baseline"],
            "command": " ; ".join(doc["command"] for doc in docs),
            "quick": all(doc.get("quick") for doc in docs),
            "complete": all(doc.get("complete") for doc in docs),
            "measured_at": max(doc["measured_at"] for doc in docs),
            "seconds": sum(doc.get("seconds") or 0 for doc in docs),
            "parts": [{key: doc.get(key) for key in ("parts", "command", "measured_at",
                                                      "seconds", "complete")} for doc in docs],
            "figures": figures, "baseline_figures": baseline,
            "diff": diff_rows(figures, baseline) if baseline is not None else None,
            "more_baselines": [], "details": details}


def main() -> int:
    global CONFIG, MODEL  # noqa: PLW0603 - one run's settings, read by the steps above
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the quick set (module docstring)")
    p.add_argument("--baseline", help="also measure this commit's tree (.ab/COMMIT); a comma "
                   "list: several, the first being `baseline` in the JSON, the others "
                   "`more_baselines`")
    p.add_argument("--no-engine", action="store_true", help="skip the offline engine rows "
                   "(not measured); the sweeps then offer shares of --capacity")
    p.add_argument("--capacity", default=str(DEFAULT_CAPACITY_ITEMS_PER_S),
                   help="items/s the sweeps' shares refer to where the engine is not measured: "
                   "one number for bf16, or bf16=N,fp8=M,feed=N")
    p.add_argument("--fp8", action="store_true", help="with --quick: the FP8 sweeps too")
    p.add_argument("--lora", action="store_true", help="with --quick: the LoRA rows (engine, "
                   "and a lone request with an adapter over HTTP)")
    p.add_argument("--idle-cost", action="store_true", help="with --quick: load control's cost "
                   "to a lone request (an application without it)")
    p.add_argument("--overload", default=",".join(f"{m:g}" for m in OVERLOAD),
                   help="multiples of the best rate for goodput past capacity (empty: none)")
    p.add_argument("--commit", help="the commit of this tree (default: $COMMIT, else git HEAD)")
    p.add_argument("--lone-requests", type=int, default=40,
                   help="measured sporadic requests per tree and shape")
    p.add_argument("--sweep-shares", default=",".join(map(str, SWEEP_SHARES)),
                   help="the sweep's rates as shares of the engine's items/s")
    p.add_argument("--parts", default="bench", help="the workloads' parts to measure, a comma "
                   f"list of {', '.join(PARTS)} (module docstring)")
    p.add_argument("--merge", type=Path, nargs="+", metavar="PART_JSON", help="join these part "
                   "runs' JSONs into --out instead of measuring")
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--config", default=CONFIG, help="each tree's config (a path in the tree)")
    p.add_argument("--model", type=Path, default=MODEL, help="the model every tree serves")
    args = p.parse_args()
    if args.merge:
        doc = merge_parts([json.loads(path.read_text()) for path in args.merge])
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"merged {len(args.merge)} parts into {args.out}")
        print_figures(doc)
        return 0
    parts = tuple(args.parts.split(","))
    if not parts or set(parts) - set(PARTS):
        p.error(f"--parts: a comma list of {', '.join(PARTS)}, not {args.parts!r}")
    CONFIG, MODEL = args.config, args.model.resolve()
    if not (MODEL / "config.json").is_file():
        sys.exit(f"{MODEL} is missing: python -m tools.random_model")
    commit = args.commit or os.environ.get("COMMIT") or git_commit()
    trees = [Tree("head", REPO_ROOT, commit)]
    baselines = args.baseline.split(",") if args.baseline else []
    for k, other in enumerate(baselines):
        trees.append(Tree("base" if k == 0 else f"base{k + 1}", baseline_tree(other), other))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # `timeout` stops a run with SIGTERM: leave through the finally blocks (the service is
    # stopped, what was measured written)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    figures = {t.label: dict.fromkeys(FIGURES) for t in trees}
    details: dict = {t.label: {} for t in trees}

    def write(complete: bool) -> dict:
        doc = {"gpu": gpu_name(), "commit": commit, "baseline": baselines[0] if baselines else None,
               "command": "python -m loadtest.headline " + shlex.join(sys.argv[1:]),
               "quick": args.quick, "parts": list(parts), "complete": complete,
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "seconds": round(time.monotonic() - started),
               "figures": figures["head"],
               "baseline_figures": figures.get("base"),
               "diff": diff_rows(figures["head"], figures["base"]) if baselines else None,
               "more_baselines": [{"commit": t.commit, "figures": figures[t.label],
                                   "diff": diff_rows(figures["head"], figures[t.label])}
                                  for t in trees[2:]],
               "details": details}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        return doc

    complete = False
    try:
        with tempfile.TemporaryDirectory(prefix="headline-engine-") as tmp:
            measure(trees, args.quick, args.fp8, args.lora, Path(tmp), args.lone_requests, figures,
                    details, args.out.with_name(args.out.stem + "_service.log"),
                    capacities(args.capacity) if args.no_engine else None,
                    [float(x) for x in args.sweep_shares.split(",")],
                    [float(x) for x in args.overload.split(",") if x],
                    measured=lambda: write(False), idle_cost=args.idle_cost, parts=parts)
        complete = True
    finally:  # what was measured is written, also when a step failed
        doc = write(complete)
    print(f"\nheadline at {commit} on {doc['gpu']} ({doc['seconds']} s); wrote {args.out}")
    print_figures(doc)
    return 0


def print_figures(doc: dict) -> None:
    """The figures of a headline JSON, today's against the baseline's, flagged per the diff."""
    print(f"{'figure':32s} {'head':>10s} {'baseline':>10s} {'change':>8s}")
    rows = {r["figure"]: r for r in doc["diff"] or []}
    for key in FIGURES:
        new, row = doc["figures"].get(key), rows.get(key)
        old = (doc.get("baseline_figures") or {}).get(key)
        flag = " REGRESSION" if row and row["regression"] else ""
        change = f"{row['change']:+.1%}" if row else ""
        print(f"{key:32s} {_fmt(new):>10s} {_fmt(old):>10s} {change:>8s}{flag}")


def capacities(text: str) -> dict[str, float]:
    """--capacity: "2690" (bf16) or "bf16=2690,fp8=3238"."""
    if "=" not in text:
        return {"bf16": float(text)}
    return {name: float(value) for name, value in (part.split("=") for part in text.split(","))}


def _fmt(value) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
