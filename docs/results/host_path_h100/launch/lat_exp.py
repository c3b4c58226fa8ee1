"""Where a lone 10 x 300 graph launch spends its time, whether split graphs start the GPU
earlier, which kernels fill the 3,072-token graph, and what TunableOp would pick for its GEMMs."""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from gpu_worker.engine import Engine, ScoreTask, _host_metadata
from gpu_worker.host_tensors import int64_tensor
from loadtest.configs import shipped_app_config
from loadtest.workload import RequestFactory, Workload
from ranker_contract.packing import pack_request

OUT = os.environ.get("OUT", "/tmp")
res = {"gpu": torch.cuda.get_device_name(), "command": "python3 .device/lat_exp.py"}
app = shipped_app_config("score-gpu.yaml")
eng = Engine.from_config(app.resolved_model_path(), app.engine)
wl = Workload(query_len=0, items=10, item_len=300)
q, items = RequestFactory(wl, seed=0).token_ids()
seqs = pack_request(q, items, item_first=False, delimiter_id=0, max_seq_tokens=16384,
                    max_context=32768)
tasks = [ScoreTask(s, list(wl.labels), lambda _: None) for s in seqs]
for _ in range(5):
    eng.finish(eng.launch(tasks))
sequences = [t.sequence for t in tasks]
ids, pos, rows, lrows, lids = _host_metadata(tasks)
g = eng.graphs.pick(sequences, len(rows), len(lids))
print("graph", g.tokens, g.rows, flush=True)


def pieces_launch(replay):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pad_t = [0] * (g.tokens - len(ids))
    host = int64_tensor(ids + pad_t + pos + pad_t + rows + [0] * (g.rows - len(rows)) + lrows
                        + [0] * (g.labels - len(lids)) + lids + [0] * (g.labels - len(lids)),
                        pin=True)
    g.meta.copy_(host, non_blocking=True)
    t1 = time.perf_counter()
    keep = g.attention.plan(sequences, eng.dtype)
    t2 = time.perf_counter()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    replay()
    t3 = time.perf_counter()
    e1.record()
    e1.synchronize()
    t4 = time.perf_counter()
    return {"meta": t1 - t0, "plan": t2 - t1, "replay_call": t3 - t2, "wall": t4 - t0,
            "gpu_replay": e0.elapsed_time(e1) / 1e3, "keep": keep}


def summarize(runs):
    return {k: round(statistics.median(r[k] for r in runs) * 1e3, 3)
            for k in ("meta", "plan", "replay_call", "wall", "gpu_replay")}


for _ in range(3):
    pieces_launch(g.graph.replay)
res["one_graph"] = summarize([pieces_launch(g.graph.replay) for _ in range(30)])
print("one graph", res["one_graph"], flush=True)

# --- the same forward captured as K graphs (layers split evenly) ----------------------------
model, ops, attention = eng.model, eng.ops, g.attention
ids_t, pos_t, rows_t, lrows_t, lids_t = g.meta.split([g.tokens, g.tokens, g.rows, g.labels,
                                                      g.labels])
layers = model.model.layers
n = len(layers)


def capture_split(k):
    bounds = [round(i * n / k) for i in range(k + 1)]
    state = {}
    graphs = []
    pool = torch.cuda.graph_pool_handle()

    def piece(i):
        def run():
            if i == 0:
                x, residual = model.model.embed_tokens(ids_t), None
            else:
                x, residual = state["x"], state["res"]
            for j in range(bounds[i], bounds[i + 1]):
                x, residual = layers[j](x, residual, pos_t, ops, attention,
                                        rows_t if j == n - 1 else None)
            if i == k - 1:
                x, _ = ops.add_rms_norm(x, residual, model.model.norm.weight,
                                        model.model.norm.eps)
                return model.label_logprobs(x, lrows_t, lids_t)
            state["x"], state["res"] = x, residual
            return None
        return run

    out = None
    for i in range(k):
        run = piece(i)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            run()
        torch.cuda.current_stream().wait_stream(side)
        gr = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(gr, pool=pool):
            o = run()
        if o is not None:
            out = o
        graphs.append(gr)
    return graphs, out


ref = None
pieces_launch(g.graph.replay)
torch.cuda.synchronize()
ref = g.out[: len(lids)].clone()
for k in ():
    try:
        grs, out = capture_split(k)

        def replay_all():
            for gr in grs:
                gr.replay()
        for _ in range(3):
            pieces_launch(replay_all)
        runs = [pieces_launch(replay_all) for _ in range(30)]
        torch.cuda.synchronize()
        diff = (out[: len(lids)] - ref).abs().max().item()
        res[f"split_{k}"] = {**summarize(runs), "max_abs_diff_vs_one_graph": diff}
        print(f"split {k}", res[f"split_{k}"], flush=True)
        # one graph again, interleaved: the machine's drift
        res[f"one_graph_after_{k}"] = summarize([pieces_launch(g.graph.replay)
                                                 for _ in range(30)])
        print("  one graph again", res[f"one_graph_after_{k}"], flush=True)
        del grs
    except Exception as e:  # noqa: BLE001
        res[f"split_{k}"] = {"error": repr(e)[:300]}
        print("split", k, repr(e)[:300], flush=True)

# --- kernels of the graph replay -------------------------------------------------------------
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        pieces_launch(g.graph.replay)
kern = {}
for e in prof.key_averages():
    kern[e.key] = kern.get(e.key, 0) + e.self_device_time_total / 5 / 1e3
top = sorted(kern.items(), key=lambda kv: -kv[1])[:25]
res["graph_kernels_ms"] = [(name[:90], round(ms, 3)) for name, ms in top]
res["graph_kernel_total_ms"] = round(sum(kern.values()), 3)
print("kernel total", res["graph_kernel_total_ms"])
for name, ms in top:
    print(f"  {ms:7.3f}  {name[:100]}")
sys.stdout.flush()

# --- GEMMs of the model: default cuBLAS vs TunableOp's pick ---------------------------------
def time_ms(fn, reps=50):
    for _ in range(5):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / reps


shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
gemm = []
ws = {k: torch.randn(nk, dtype=torch.bfloat16, device="cuda") * 0.02 for k, nk in shapes.items()}
for m in (256, 1024, 2048, 3072, 4096, 32768):
    for name, (nn_, kk) in shapes.items():
        x = torch.randn(m, kk, dtype=torch.bfloat16, device="cuda")
        w = ws[name]
        gemm.append({"m": m, "gemm": name, "default_ms": time_ms(lambda: F.linear(x, w)),
                     "_x": x, "_w": w})
try:
    import torch.cuda.tunable as tunable
    tunable.enable(True)
    tunable.tuning_enable(True)
    tunable.set_filename(f"{OUT}/tunableop_results.csv")
    tunable.set_max_tuning_duration(200)
    for r in gemm:
        x, w = r["_x"], r["_w"]
        refo = F.linear(x, w) if False else None
        tuned = time_ms(lambda: F.linear(x, w))
        r["tuned_ms"] = tuned
        r["ratio"] = tuned / r["default_ms"]
    tunable.enable(False)
    for r in gemm:
        x, w = r["_x"], r["_w"]
        r["default_again_ms"] = time_ms(lambda: F.linear(x, w))
    try:
        tunable.write_file()
    except Exception as e:  # noqa: BLE001
        print("write_file", e)
except Exception as e:  # noqa: BLE001
    res["tunable_error"] = repr(e)[:400]
    print("tunable", repr(e)[:400])
for r in gemm:
    r.pop("_x"), r.pop("_w")
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
res["gemm"] = gemm
with open(f"{OUT}/lat_exp.json", "w") as f:
    json.dump(res, f, indent=1, default=str)
