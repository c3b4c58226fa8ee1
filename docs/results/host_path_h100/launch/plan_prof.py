"""Host time of a lone 10 x 300 graph launch: cProfile of the attention plan and the meta copy."""
import cProfile, pstats, time, statistics, array, io
import torch
from gpu_worker.engine import Engine, ScoreTask, _host_metadata
from gpu_worker.host_tensors import int64_tensor
from gpu_worker.attention_flashinfer import paged_layout
from loadtest.configs import shipped_app_config
from loadtest.workload import RequestFactory, Workload
from ranker_contract.packing import pack_request

app = shipped_app_config("score-gpu.yaml")
eng = Engine.from_config(app.resolved_model_path(), app.engine)
wl = Workload(query_len=0, items=10, item_len=300)
q, items = RequestFactory(wl, seed=0).token_ids()
seqs = pack_request(q, items, item_first=False, delimiter_id=0, max_seq_tokens=16384, max_context=32768)
tasks = [ScoreTask(s, list(wl.labels), lambda _: None) for s in seqs]
for _ in range(5):
    eng.finish(eng.launch(tasks))
sequences = [t.sequence for t in tasks]
ids, pos, rows, lrows, lids = _host_metadata(tasks)
g = eng.graphs.pick(sequences, len(rows), len(lids))
att = g.attention

def t(fn, n=50):
    xs = []
    for _ in range(n):
        torch.cuda.synchronize()
        a = time.perf_counter(); fn(); xs.append(time.perf_counter() - a)
    return round(statistics.median(xs) * 1e3, 3)

vals = ids + [0] * (g.tokens - len(ids))
print("host_metadata", t(lambda: _host_metadata(tasks)))
print("pick", t(lambda: eng.graphs.pick(sequences, len(rows), len(lids))))
print("array q", t(lambda: array.array("q", vals * 2)))
arr = array.array("q", vals * 2)
print("frombuffer", t(lambda: torch.frombuffer(arr, dtype=torch.int64)))
ft = torch.frombuffer(arr, dtype=torch.int64)
print("pin_memory", t(lambda: ft.pin_memory()))
pinned = torch.empty(ft.shape, dtype=torch.int64, pin_memory=True)
print("copy into persistent pinned", t(lambda: pinned.copy_(ft)))
print("empty pinned", t(lambda: torch.empty(ft.shape, dtype=torch.int64, pin_memory=True)))
dev = torch.empty(ft.shape, dtype=torch.int64, device="cuda")
print("h2d non_blocking", t(lambda: dev.copy_(pinned, non_blocking=True)))
print("paged_layout", t(lambda: paged_layout(sequences)))
print("plan total", t(lambda: att.plan(sequences, eng.dtype)))
qo, kv, kvi = paged_layout(sequences)
print("kvi pin+to", t(lambda: torch.frombuffer(kvi, dtype=torch.int32).pin_memory().to("cuda", non_blocking=True)))
prof = cProfile.Profile()
for _ in range(50):
    torch.cuda.synchronize()
    prof.enable(); att.plan(sequences, eng.dtype); prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:6000])
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
print(s.getvalue()[:6000])
import flashinfer, inspect
src = inspect.getsource(type(att.wrapper).plan)
open("/tmp/plan_src.py", "w").write(src)
import os, shutil
shutil.copy("/tmp/plan_src.py", os.environ["OUT"] + "/plan_src.py")
