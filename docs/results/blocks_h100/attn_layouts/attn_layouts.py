"""Attention layouts micro-bench: MIS (current) vs shared-prefix paged (prefix pages repeated per item)."""
import array, json, os, sys, time
import torch, flashinfer
sys.path.insert(0, ".")
from gpu_worker.attention_flashinfer import FlashInferAttention
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import pack_multi_item, pack_plain

HQ, HK, D = 16, 8, 128
dev = torch.device("cuda")
class Cfg: num_attention_heads=HQ; num_key_value_heads=HK; head_dim=D

def layout(seqs):
    qo, kvp, idx = [0], [0], array.array("i")
    off = 0
    for s in seqs:
        n, P = s.num_tokens, s.prefix_len
        if P == n:
            idx.extend(range(off, off + n)); qo.append(off + n); kvp.append(len(idx)); off += n; continue
        idx.extend(range(off, off + P + 1)); qo.append(off + P + 1); kvp.append(len(idx))
        d = P
        for r in s.score_rows:
            nxt = r + 1 if r != P - 1 else d + 1
            idx.extend(range(off, off + P)); idx.extend(range(off + d + 1, off + nxt + 1))
            qo.append(off + nxt + 1); kvp.append(len(idx)); d = nxt
        assert d == n - 1, (d, n)
        off += n
    return qo, kvp, idx

def run_case(name, seqs, reps=20):
    T = sum(s.num_tokens for s in seqs)
    q = torch.randn(T, HQ, D, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(T, 2 * HK, D, dtype=torch.bfloat16, device=dev)
    k, v = kv[:, :HK], kv[:, HK:]
    res = {"case": name, "tokens": T, "sequences": len(seqs)}
    outs = {}
    for backend in ("fa2", "fa3"):
        try:
            a = FlashInferAttention(Cfg, dev, backend)
            t0 = time.perf_counter(); keep = a.plan(seqs, torch.bfloat16); torch.cuda.synchronize(); res[f"mis_{backend}_plan_ms"] = 1e3*(time.perf_counter()-t0)
            a(q, k, v); torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
            e0.record()
            for _ in range(reps): o = a(q, k, v)
            e1.record(); torch.cuda.synchronize()
            res[f"mis_{backend}_ms"] = e0.elapsed_time(e1) / reps; outs[f"mis_{backend}"] = o.clone()
        except Exception as exc:
            res[f"mis_{backend}_error"] = repr(exc)[:300]
        try:
            ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
            t0 = time.perf_counter()
            qo, kvp, idx = layout(seqs)
            qo_t = torch.tensor(qo, dtype=torch.int32); kvp_t = torch.tensor(kvp, dtype=torch.int32)
            idx_t = torch.frombuffer(idx, dtype=torch.int32).pin_memory().to(dev, non_blocking=True)
            w.plan(qo_t, kvp_t, idx_t, torch.ones(len(qo) - 1, dtype=torch.int32), HQ, HK, D, 1,
                   causal=True, pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            torch.cuda.synchronize(); res[f"sp_{backend}_plan_ms"] = 1e3*(time.perf_counter()-t0)
            res["sp_requests"] = len(qo) - 1; res["sp_kv_indices"] = len(idx)
            out = torch.empty_like(q)
            w.run(q, (k.unsqueeze(1), v.unsqueeze(1)), out=out); torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
            e0.record()
            for _ in range(reps): w.run(q, (k.unsqueeze(1), v.unsqueeze(1)), out=out)
            e1.record(); torch.cuda.synchronize()
            res[f"sp_{backend}_ms"] = e0.elapsed_time(e1) / reps; outs[f"sp_{backend}"] = out.clone()
        except Exception as exc:
            res[f"sp_{backend}_error"] = repr(exc)[:300]
    # compare on rows that are read: all except delimiter rows
    mask = torch.ones(T, dtype=torch.bool)
    off = 0
    for s in seqs:
        for i, t in enumerate(s.token_pos_in_items):
            if t == 0: mask[off + s.prefix_len + i] = False
        off += s.num_tokens
    mask = mask.to(dev)
    ref = outs.get("mis_fa2")
    for key, o in outs.items():
        if ref is not None:
            res[f"{key}_maxdiff_vs_mis_fa2"] = (o[mask].float() - ref[mask].float()).abs().max().item()
    print(json.dumps(res), flush=True)
    return res

g = torch.Generator().manual_seed(0)
def rnd(n): return torch.randint(100, 150000, (n,), generator=g).tolist()
def req(P, n, L): return pack_multi_item(rnd(P), [rnd(L) for _ in range(n)], 0)
cases = [
    ("bench_batch_33x(120+10x180)", [req(120, 10, 180) for _ in range(33)]),
    ("one_request_120+10x180", [req(120, 10, 180)]),
    ("one_request_120+50x200", [req(120, 50, 200)]),
    ("one_request_50+100x20", [req(50, 100, 20)]),
    ("batch_8x(300+20x100)", [req(300, 20, 100) for _ in range(8)]),
    ("mixed_lengths", [pack_multi_item(rnd(64), [rnd(L) for L in (1, 0, 37, 250, 5, 499)], 0), pack_plain(rnd(77), 0), req(10, 3, 3)]),
]
results = [run_case(n, s) for n, s in cases]
json.dump(results, open(os.path.join(os.environ.get("OUT", "/tmp"), "attn_layouts.json"), "w"), indent=1)
