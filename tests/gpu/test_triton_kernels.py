"""Our Triton kernels against float64 references, on fresh random inputs."""

import pytest
import torch

from gpu_worker.kernels.qkv import qkv_prepare
from gpu_worker.model.decoder import Attention
from gpu_worker.model.ops import TorchOps, _rope_cache
from ranker_contract.model_config import ModelConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: only under TRITON_INTERPRET=1


def _config(qk_norm: bool, heads=16, kv_heads=8, head_dim=128) -> ModelConfig:
    return ModelConfig.from_dict({
        "model_type": "qwen3" if qk_norm else "llama", "vocab_size": 64, "hidden_size": 256,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "max_position_embeddings": 4096,
        "rope_theta": 1e6, "rms_norm_eps": 1e-6})


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qwen3", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(qk_norm, dtype):
    cfg = _config(qk_norm)
    attn = Attention(cfg, layer=0).to(DEVICE)
    if qk_norm:
        torch.nn.init.normal_(attn.q_norm.weight, 1.0, 0.2)
        torch.nn.init.normal_(attn.k_norm.weight, 1.0, 0.2)
    t = 37
    qkv = torch.randn(t, attn.q_size + 2 * attn.kv_size, device=DEVICE).to(dtype) * 3
    positions = torch.randint(0, 4096, (t,), device=DEVICE)
    ref = TorchOps(cfg).prepare_qkv(qkv.double(), positions, attn.double())
    out = qkv_prepare(qkv.clone(), positions, _rope_cache(cfg, DEVICE), attn.num_heads,
                      attn.num_kv_heads,
                      attn.head_dim, attn.q_norm.weight.to(dtype) if qk_norm else None,
                      attn.k_norm.weight.to(dtype) if qk_norm else None, cfg.rms_norm_eps)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for got, want in zip(out, ref):
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < tol, err
    assert out[1].stride() == out[2].stride()  # K and V share one layout for FlashInfer


@pytest.mark.parametrize("hidden", [1024, 576])
def test_add_rms_norm_fp32_residual(hidden):
    from gpu_worker.kernels.add_norm import add_rms_norm_fp32_residual

    x = torch.randn(29, hidden, device=DEVICE).to(torch.bfloat16)
    residual = torch.randn(29, hidden, device=DEVICE) * 10
    weight = torch.randn(hidden, device=DEVICE).to(torch.bfloat16)
    want_res = residual.double() + x.double()
    want = want_res * torch.rsqrt(want_res.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    got, got_res = add_rms_norm_fp32_residual(x.clone(), residual.clone(), weight, 1e-6)
    assert ((got_res.double() - want_res).norm() / want_res.norm()).item() < 1e-6
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.parametrize("hidden", [1024, 2560, 4096])
def test_add_rms_norm_fp32_residual_quantized(hidden):
    """With fp8, the same kernel hands out the normed rows quantized (for an FP8 linear): the
    residual as without, and the e4m3 codes of the bf16 rows it would have written."""
    from gpu_worker.kernels.add_norm import add_rms_norm_fp32_residual
    from gpu_worker.model.fp8 import FP8, FP8_MAX, MIN_SCALE

    g = torch.Generator(device=DEVICE).manual_seed(hidden)
    x = torch.randn(300, hidden, generator=g, device=DEVICE).to(torch.bfloat16)
    residual = torch.randn(300, hidden, generator=g, device=DEVICE) * 10
    weight = torch.randn(hidden, generator=g, device=DEVICE).to(torch.bfloat16)
    rows, want_res = add_rms_norm_fp32_residual(x.clone(), residual.clone(), weight, 1e-6)
    (q, scale), got_res = add_rms_norm_fp32_residual(x.clone(), residual.clone(), weight, 1e-6,
                                                     fp8=(FP8_MAX, MIN_SCALE))
    assert torch.equal(got_res, want_res)
    want_scale = (rows.float().abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
    want_q = (rows.float() / want_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    assert q.shape == (300, hidden) and scale.shape == (300, 1)
    torch.testing.assert_close(scale, want_scale, rtol=2**-20, atol=0)
    same = (q.view(torch.uint8) == want_q.view(torch.uint8)).float().mean().item()
    print(f"add + RMSNorm + e4m3, hidden {hidden}: {same:.5f} of codes identical")
    assert same >= 0.995


@pytest.mark.parametrize("rows", [1, 200, 16384 + 77])
def test_gate_up_silu_matches_the_unfused_path(rows):
    """The fused gate/up GEMM + SwiGLU gives what cuBLAS + SiLU-and-mul give (the same bf16
    roundings), and is no further from a float64 reference."""
    from gpu_worker.kernels.gate_up_silu import gate_up_silu

    hidden, inter = 1024, 3072
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    x = torch.randn(rows, hidden, generator=g, device=DEVICE).to(torch.bfloat16)
    w = (torch.randn(2 * inter, hidden, generator=g, device=DEVICE) * 0.02).to(torch.bfloat16)
    got = gate_up_silu(x, w).float()
    gate, up = torch.nn.functional.linear(x, w).chunk(2, dim=-1)  # bf16, as cuBLAS writes it
    unfused = (torch.nn.functional.silu(gate.float()) * up.float()).to(torch.bfloat16).float()
    gate64, up64 = (x.double() @ w.double().T).chunk(2, dim=-1)
    exact = torch.nn.functional.silu(gate64) * up64
    assert got.shape == (rows, inter)
    same = (got == unfused).float().mean().item()
    err_fused = ((got.double() - exact).norm() / exact.norm()).item()
    err_unfused = ((unfused.double() - exact).norm() / exact.norm()).item()
    print(f"rows {rows}: {same:.5f} identical; rel. error fused {err_fused:.2e}, "
          f"unfused {err_unfused:.2e}")
    assert same >= 0.999
    assert err_fused <= 1.05 * err_unfused


@pytest.mark.parametrize("rows, width", [(1, 1024), (300, 3072), (64, 9728)])
def test_fp8_row_quantizers_match_a_float64_reference(rows, width):
    """Per-row e4m3 quantization, plain and fused with SiLU(gate) * up (rounded to bf16 first,
    as the unfused path stores it): the same scales, and the same e4m3 codes but for values
    on a rounding edge (one step apart at most; measured 0.17% of them against a float64
    division, 2026-11-25, H100)."""
    from gpu_worker.kernels.fp8_quant import quantize_rows_fp8, silu_mul_quantize_rows_fp8
    from gpu_worker.model.fp8 import FP8, FP8_MAX, MIN_SCALE

    g = torch.Generator(device=DEVICE).manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * width, generator=g, device=DEVICE) * 3).to(torch.bfloat16)
    gate_up[0] = 0  # an all-zero row (padding) takes the smallest scale
    gate, up = gate_up.double().chunk(2, dim=-1)
    silu_mul = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).double()
    for name, kernel, x, exact in (
            ("plain", quantize_rows_fp8, gate_up[:, :width], gate),
            ("silu_mul", silu_mul_quantize_rows_fp8, gate_up, silu_mul)):
        q, scale = kernel(x, fp8_max=FP8_MAX, min_scale=MIN_SCALE)
        # The kernels divide by the fp32 scale in fp32: so does the reference, from float64
        # inputs rounded to fp32 (in float64 0.2% of the codes land across a rounding edge).
        want_scale = (exact.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
        want_q = (exact.float() / want_scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        assert q.shape == (rows, width) and scale.shape == (rows, 1)
        torch.testing.assert_close(scale.double(), want_scale, rtol=2**-7, atol=0)
        same = (q.view(torch.uint8) == want_q.view(torch.uint8)).float().mean().item()
        step = (q.double() - want_q.double()).abs() <= 2**-3 * want_q.double().abs() + 2**-9
        print(f"{name} {rows}x{width}: {same:.5f} of codes identical")
        assert same >= 0.995 and bool(step.all()), name


@pytest.mark.parametrize("kind", ["plain", "swiglu", "added"])
@pytest.mark.parametrize("order", ["sorted", "interleaved"])
@pytest.mark.parametrize("repeats", [1, 3])  # 2,006 or 6,018 rows
def test_lora_kernels_match_a_float64_reference(kind, order, repeats):
    """lora_shrink + lora_linear (qkv, gate/up with SwiGLU) or cuBLAS + lora_add (o, down) over
    base rows and three adapters (rank 64 of the 0.6B shapes): as close to a float64
    x Wᵀ + (x Aᵀ) Bᵀ as LoraLinear's slice path (cuBLAS, bf16 roundings between) is; rows
    sorted by adapter, as the scheduler sends them, and in any order."""
    from gpu_worker.kernels.lora import lora_add, lora_linear, lora_shrink

    swiglu = kind == "swiglu"
    hidden, out = {"plain": (1024, 4096), "swiglu": (1024, 6144), "added": (3072, 1024)}[kind]
    rank, adapters = 64, 3
    g = torch.Generator(device=DEVICE).manual_seed(7)
    runs = ([0] * 300 + [2] * 1000 + [1] * 77 + [0] * 129 + [3] * 500) * repeats

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(torch.bfloat16)

    if order == "interleaved":
        runs = [runs[i] for i in torch.randperm(len(runs), generator=g, device=DEVICE).tolist()]
    slots = torch.tensor(runs, device=DEVICE)
    x, w = randn(len(runs), hidden), randn(out, hidden, scale=0.02)
    a, b = randn(adapters, rank, hidden, scale=0.03), randn(adapters, out, rank, scale=0.05)
    t = lora_shrink(x, a, slots)
    if kind == "added":
        got = torch.nn.functional.linear(x, w)
        lora_add(got, t, b, slots)
    else:
        got = lora_linear(x, w, t, b, slots, swiglu=swiglu)
    pick = torch.cat([torch.zeros(1, rank, hidden, device=DEVICE, dtype=torch.bfloat16), a])[slots]
    t_ref = torch.einsum("mk,mrk->mr", x.float(), pick.float()).to(torch.bfloat16)
    assert (t == t_ref).float().mean().item() >= 0.99
    b_pick = torch.cat([torch.zeros(1, out, rank, device=DEVICE, dtype=torch.bfloat16), b])[slots]
    # both paths round t to bf16 before the second GEMM: the reference starts from that t
    exact = x.double() @ w.double().T + torch.einsum("mr,mor->mo", t_ref.double(),
                                                     b_pick.double())
    sliced = torch.nn.functional.linear(x, w)  # the slice path: bf16 GEMM, then the delta added
    for s in range(1, adapters + 1):
        rows = slots == s
        sliced[rows] += t[rows] @ b[s - 1].T
    if swiglu:
        gate64, up64 = exact.chunk(2, dim=-1)
        exact = torch.nn.functional.silu(gate64) * up64
        gate, up = sliced.chunk(2, dim=-1)
        sliced = (torch.nn.functional.silu(gate.float()) * up.float()).to(torch.bfloat16)
    assert got.shape == exact.shape
    err = ((got.double() - exact).norm() / exact.norm()).item()
    err_sliced = ((sliced.double() - exact).norm() / exact.norm()).item()
    print(f"lora {order} {kind} ({len(runs)} rows): rel. error kernels {err:.2e}, "
          f"slice path {err_sliced:.2e}")
    assert err <= 1.05 * err_sliced


def test_lora_shrink_reads_an_fp8_linears_quantized_rows_as_their_dequantized_values():
    """lora_shrink of e4m3 rows and their fp32 scales (an FP8 linear's input,
    gpu_worker/model/fp8.py) equals, after bf16 rounding, (q Aᵀ) · scale in fp32 for nearly every
    entry, and the slices' dequantize-then-multiply within bf16's step: Fp8LoraLinear's two
    paths."""
    from gpu_worker.kernels.fp8_quant import quantize_rows_fp8
    from gpu_worker.kernels.lora import lora_shrink
    from gpu_worker.model.fp8 import FP8_MAX, MIN_SCALE

    hidden, rank, adapters = 3072, 64, 3
    g = torch.Generator(device=DEVICE).manual_seed(11)
    runs = [0] * 200 + [2] * 700 + [1] * 77 + [3] * 300
    slots = torch.tensor(runs, device=DEVICE)[torch.randperm(len(runs), generator=g,
                                                             device=DEVICE)]
    x = torch.randn(len(runs), hidden, generator=g, device=DEVICE).to(torch.bfloat16)
    a = (torch.randn(adapters, rank, hidden, generator=g, device=DEVICE) * 0.03).to(
        torch.bfloat16)
    q, scale = quantize_rows_fp8(x, fp8_max=FP8_MAX, min_scale=MIN_SCALE)
    t = lora_shrink(q, a, slots, scale)
    pick = torch.cat([torch.zeros(1, rank, hidden, device=DEVICE, dtype=torch.bfloat16), a])[slots]
    want = (torch.einsum("mk,mrk->mr", q.float(), pick.float()) * scale).to(torch.bfloat16)
    same = (t == want).float().mean().item()
    sliced = torch.einsum("mk,mrk->mr", (q.to(torch.bfloat16) * scale.to(torch.bfloat16)).float(),
                          pick.float())
    err = ((t.double() - sliced.double()).norm() / sliced.double().norm()).item()
    print(f"lora shrink of fp8 rows: {same:.4f} identical to the fp32 reference; "
          f"rel. difference from the slices {err:.2e}")
    assert same >= 0.99 and err <= 2**-7
    assert bool((t[slots == 0] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [1, 64, 4096, 151_936])
def test_log_sum_exp_rows_matches_reference_and_ignores_the_other_rows(dtype, cols):
    from gpu_worker.kernels.logsumexp import log_sum_exp_rows

    gen = torch.Generator().manual_seed(cols)
    x = (torch.randn(40, cols, generator=gen) * 8).to(dtype).to(DEVICE)
    x[3, cols // 2] = 300.0  # one logit far above the rest: the running maximum moves
    got = log_sum_exp_rows(x)
    want = torch.logsumexp(x.double(), dim=-1)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-5), (got - want).abs().max()
    # a row's bits do not depend on which or how many rows come with it
    for rows in ([7], [0, 7], list(range(7, 40))):
        assert torch.equal(log_sum_exp_rows(x[rows])[rows.index(7)], got[7])


def _short_item_batch(rng, sequences_n, cached, dtype):
    """Multi-item sequences of queries of 1 to 150 tokens and items of 0 to 40 (short and not),
    random q/k/v for their rows, and with `cached` each query's first rows as cached key rows
    after the batch's (as flashinfer.cached_gather lays them): (sequences, cached_rows, q, k,
    v)."""
    from gpu_worker.attention.prefix_cache import cached_form
    from ranker_contract.packing import pack_multi_item

    wholes = [pack_multi_item([1] * rng.randint(1, 150),
                              [[2] * rng.randint(0, 40) for _ in range(rng.randint(1, 30))], 0)
              for _ in range(sequences_n)]
    cuts = [rng.randint(1, w.prefix_len) if cached else 0 for w in wholes]
    sequences = [cached_form(w, c) if c else w for w, c in zip(wholes, cuts)]
    rows = sum(s.num_tokens for s in sequences)
    cached_rows, at = [], rows
    for c in cuts:
        cached_rows.append(range(at, at + c) if c else None)
        at += c
    gen = torch.Generator().manual_seed(rng.randint(0, 1 << 30))
    q = torch.randn(rows, 16, 128, generator=gen).to(dtype).to(DEVICE)
    kv = torch.randn(at, 2, 8, 128, generator=gen).to(dtype).to(DEVICE)
    return sequences, cached_rows, q, kv[:, 0], kv[:, 1]


# the interpreter (TRITON_INTERPRET=1) gets a bf16 tl.dot wrong: float32 there
@pytest.mark.parametrize("dtype", [torch.bfloat16 if DEVICE == "cuda" else torch.float32])
@pytest.mark.parametrize("cached", [False, True], ids=["miss", "cached query rows"])
def test_short_item_attention_matches_reference_and_a_row_its_lone_computation(cached, dtype):
    """gpu_worker/kernels/short_item_attention.py against a float64 softmax over each row's keys
    (its query's, then its own item's up to itself); and each item's rows bit for bit what the
    kernel computes for that item alone after its query, whatever shares its tiles."""
    import random

    from gpu_worker.attention.short_items import (
        SHORT_ITEM_TOKENS,
        short_item_tables,
        short_runs,
    )
    from gpu_worker.kernels.short_item_attention import (
        short_item_attention,
        short_item_attention_reference,
    )
    from ranker_contract.packing import pack_multi_item

    rng = random.Random(7 + cached)

    def run(sequences, cached_rows, q, k, v):
        tiles, items = short_item_tables(sequences, cached_rows, SHORT_ITEM_TOKENS, 64)
        tiles = torch.frombuffer(tiles, dtype=torch.int32).view(-1, 8).to(DEVICE)
        items = torch.frombuffer(items, dtype=torch.int32).view(-1, 2).to(DEVICE)
        out = torch.full_like(q, float("nan"))
        short_item_attention(q, k, v, out, tiles, items, SHORT_ITEM_TOKENS)
        return out, tiles, items

    sequences, cached_rows, q, k, v = _short_item_batch(rng, 4, cached, dtype)
    out, tiles, items = run(sequences, cached_rows, q, k, v)
    want = short_item_attention_reference(q, k, v, tiles.cpu(), items.cpu())
    assert len(want) > 500
    for row, expected in want.items():
        err = ((out[row].double() - expected).norm() / expected.norm()).item()
        assert err < 2e-2, (row, err)
    short_rows = torch.zeros(q.shape[0], dtype=torch.bool)
    short_rows[list(want)] = True
    assert not out[short_rows.to(DEVICE)].isnan().any()
    assert out[~short_rows.to(DEVICE)].isnan().all()  # every other row left as it was

    if DEVICE != "cuda":  # the interpreter's tl.dot is numpy's: its rows follow their place
        return
    # each short item alone after its query (its rows copied to a batch of their own)
    offset, checked = 0, 0
    for seq, cached in zip(sequences, cached_rows):
        query_keys = list(cached or []) + list(range(offset, offset + seq.prefix_len))
        for blocks in short_runs(seq, SHORT_ITEM_TOKENS):
            for first, end in rng.sample(blocks, min(3, len(blocks))):
                # the lone batch: its query rows (keys only), its delimiter, the item's rows
                lone = pack_multi_item([1] * len(query_keys), [[2] * (end - first - 1)], 0)
                item = list(range(offset + first, offset + end))
                rows = [offset] * lone.block_ends[0] + item  # a query row's q is never read
                keys = query_keys + query_keys[:1] + item
                alone, _, _ = run([lone], [None], q[rows], k[keys], v[keys])
                item_rows = slice(lone.block_ends[0], lone.num_tokens)
                assert torch.equal(alone[item_rows], out[offset + first:offset + end])
                checked += 1
        offset += seq.num_tokens
    assert checked > 10
