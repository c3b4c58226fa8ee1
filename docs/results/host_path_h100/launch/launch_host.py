"""Host time of Engine.launch for the lone 10 x 300 request (graphs) and a ~31k-token bench
batch launched behind a running one (eager, overlapped), with the gpu_worker on PYTHONPATH."""
import json, os, statistics, sys, time
import torch
import gpu_worker
from gpu_worker.engine import Engine, ScoreTask
from loadtest.configs import shipped_app_config
from loadtest.workload import RequestFactory, Workload
from ranker_contract.packing import pack_request, pack_multi_item

app = shipped_app_config("score-gpu.yaml")
eng = Engine.from_config(app.resolved_model_path(), app.engine)
res = {"gpu_worker": gpu_worker.__file__, "gpu": torch.cuda.get_device_name()}

def lone():
    wl = Workload(query_len=0, items=10, item_len=300)
    q, items = RequestFactory(wl, seed=0).token_ids()
    seqs = pack_request(q, items, item_first=False, delimiter_id=0, max_seq_tokens=16384,
                        max_context=32768)
    return [ScoreTask(s, list(wl.labels), lambda _: None) for s in seqs]

def bench():
    wl = Workload(query_len=120, items=10, item_len=180)
    out = []
    for k in range(16):
        q, items = RequestFactory(wl, seed=k).token_ids()
        out.append(ScoreTask(pack_multi_item(q, items, 0), list(wl.labels), lambda _: None))
    return out

t_lone, t_bench = lone(), bench()
for _ in range(5):
    eng.finish(eng.launch(t_lone))
walls, launches = [], []
for _ in range(50):
    torch.cuda.synchronize()
    a = time.perf_counter(); st = eng.launch(t_lone); b = time.perf_counter(); eng.finish(st)
    walls.append(time.perf_counter() - a); launches.append(b - a)
res["lone_launch_ms"] = round(statistics.median(launches) * 1e3, 3)
res["lone_wall_ms"] = round(statistics.median(walls) * 1e3, 3)
res["lone_wall_p90_ms"] = round(sorted(walls)[44] * 1e3, 3)
prev = eng.launch(t_bench)
bl = []
for _ in range(20):
    a = time.perf_counter(); st = eng.launch(t_bench, overlapped=True); bl.append(time.perf_counter() - a)
    eng.finish(prev); prev = st
eng.finish(prev)
if len(sys.argv) > 2:
    import cProfile, pstats, io
    prof = cProfile.Profile()
    prev = eng.launch(t_bench)
    for _ in range(10):
        prof.enable(); st = eng.launch(t_bench, overlapped=True); prof.disable()
        eng.finish(prev); prev = st
    eng.finish(prev)
    s_ = io.StringIO(); pstats.Stats(prof, stream=s_).sort_stats("tottime").print_stats(18)
    print(sys.argv[1], s_.getvalue()[:5000])
res["bench_batch_tokens"] = sum(t.num_tokens for t in t_bench)
res["bench_launch_ms"] = round(statistics.median(bl) * 1e3, 3)
print(json.dumps(res))
with open(os.environ["OUT"] + "/launch_host_" + sys.argv[1] + ".json", "w") as f:
    json.dump(res, f, indent=1)
