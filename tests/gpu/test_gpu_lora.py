"""LoRA adapters on the GPU engine (bf16, FlashInfer, the fused kernels, CUDA graphs on): a batch
mixing two adapters and the base scores each item as HF transformers in fp32 scores it on peft's
merge_and_unload() of its adapter (or on the base). The bound: the engine's own (SAME_BF16 of
tests/gpu/test_gpu_matrix.py, what the base engine keeps from HF fp32), or, where larger, 1.5 ×
what the bf16 engine serving the merged model keeps from HF fp32. The adapters here are drawn
far larger than trained ones (peft's init_lora_weights=False) so that they move scores clearly,
and a model so far from its base strains bf16 whether merged or not: an adapter served unmerged
must be as exact as its merged model, which is what a user would otherwise serve. Each request
sent alone replays a CUDA graph (through the LoRA kernels where it has an adapter) and is held
to the same bound; base batches replay the graphs of the model alone. On an FP8 base the same
workload is held to the FP8 bounds against the bf16 base."""

import random

import pytest
import torch

from gpu_worker.forward.engine import Engine
from gpu_worker.model.lora import load_adapter
from ranker_contract.config import EngineConfig, LoraConfig, PrefixCacheConfig
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import LABELS, VOCAB, random_model_folder
from tests.gpu.test_gpu_matrix import FP8_VS_BF16, SAME_BF16, SAME_FP8, differences, within
from tests.support.adapters import ALL, write_classifier_adapter

GRAPHS = EngineConfig(device="cuda", cuda_graphs={"enabled": True, "token_buckets": [512, 2048]})
SLOTS = LoraConfig(slots=4, max_rank=16)


@pytest.fixture(scope="module")
def adapters(qwen3_path, tmp_path_factory):
    """Two seeded rank-16 adapters of the 0.6B model: (adapter folder, merged fp32 folder)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    made = []
    for k, targets in enumerate((ALL, ["q_proj", "v_proj", "gate_proj"])):
        torch.manual_seed(k)
        base = AutoModelForCausalLM.from_pretrained(qwen3_path, torch_dtype=torch.float32)
        # init_lora_weights=False draws B too, at a scale that moves scores clearly
        model = get_peft_model(base, LoraConfig(r=16, lora_alpha=16, target_modules=targets,
                                                init_lora_weights=False))
        folder = tmp_path_factory.mktemp(f"adapter{k}")
        model.save_pretrained(folder / "adapter")
        model.merge_and_unload().save_pretrained(folder / "merged")
        made.append((folder / "adapter", folder / "merged"))
    return made


def mixed_workload():
    """Four requests (three multi-item, one plain) and the adapter slot of each, the base's
    among them: (requests as (query, items or None), their sequences, their slots)."""
    rng = random.Random(5)

    def ids(n):
        return [rng.randrange(VOCAB) for _ in range(n)]

    requests = [(ids(120), [ids(180) for _ in range(10)]), (ids(300), None),
                (ids(60), [ids(90) for _ in range(6)]), (ids(120), [ids(180) for _ in range(10)])]
    sequences = [pack_plain(q, 0) if items is None else pack_multi_item(q, items, 0)
                 for q, items in requests]
    return requests, sequences, [1, 0, 2, 1]


def engine_with(qwen3_path, adapters, cfg: EngineConfig) -> Engine:
    """An engine of `cfg` with LoRA slots, holding the adapters in slots 1 and 2."""
    engine = Engine.from_config(qwen3_path, cfg, lora=SLOTS)
    model_cfg = ModelConfig.from_folder(qwen3_path)
    for folder, _ in adapters:
        engine.add_adapter(load_adapter(folder, model_cfg, engine.dtype, engine.device))
    return engine


def test_mixed_adapters_in_one_batch_score_as_hf_fp32_on_each_merged_model(qwen3_path, adapters):
    from transformers import AutoModelForCausalLM

    engine = engine_with(qwen3_path, adapters, GRAPHS)
    cfg = ModelConfig.from_folder(qwen3_path)
    requests, sequences, slots = mixed_workload()
    mixed = engine.finish(engine.launch(sequences, [LABELS] * 4, adapters=slots))
    assert all(engine.plan([seq], [LABELS]).graph is not None for seq in sequences)
    replayed = [engine.finish(engine.launch([seq], [LABELS], adapters=[slot]))[0]
                for seq, slot in zip(sequences, slots)]
    folders = [qwen3_path, *(merged for _, merged in adapters)]
    for slot in sorted(set(slots)):
        hf = AutoModelForCausalLM.from_pretrained(folders[slot], dtype=torch.float32).cuda().eval()
        picked = [k for k in range(len(slots)) if slots[k] == slot]
        want = [hf_scores(hf, *requests[k]) for k in picked]
        del hf
        merged = Engine.from_config(folders[slot], EngineConfig(device="cuda"))
        served_merged = merged.finish(merged.launch([sequences[k] for k in picked],
                                                    [LABELS] * len(picked)))
        merged_error = differences(served_merged, want)
        print(f"slot {slot}: the bf16 engine on the merged model vs HF fp32: max |Δ value| "
              f"{merged_error[0]:.2e}, max |Δ relevance| {merged_error[1]:.2e}")
        bounds = tuple(max(own, 1.5 * e) for own, e in zip(SAME_BF16, merged_error))
        within([mixed[k] for k in picked], want, bounds, f"slot {slot}, unmerged, vs HF fp32")
        within([replayed[k] for k in picked], want, bounds, f"slot {slot}, graph, vs HF fp32")
        del merged
    base = Engine.from_config(qwen3_path, EngineConfig(device="cuda"))
    plain = base.finish(base.launch(sequences, [LABELS] * 4))
    moved = max(abs(a[0][0] - b[0][0]) for a, b in zip(mixed, plain))
    print(f"adapters move the first item's first label log-prob by up to {moved:.2f}")
    assert moved > SAME_BF16[0]  # the adapters change the scores
    lone = engine.finish(engine.launch(sequences[1:2], [LABELS]))  # a lone base request: replay
    within(lone, plain[1:2], SAME_BF16, "base, replayed")
    # slot 1 loaded over with slot 2's adapter: the graphs read the new one, nothing of the old
    engine.put_adapter(1, load_adapter(adapters[1][0], cfg, engine.dtype, engine.device))
    assert (engine.finish(engine.launch(sequences[:1], [LABELS], adapters=[1]))
            == engine.finish(engine.launch(sequences[:1], [LABELS], adapters=[2])))


def hf_scores(hf, query: list[int], items: list[list[int]] | None) -> list[list[float]]:
    """Per item, the label log-probs HF computes after query + item alone (items None: after
    the query, a plain sequence of one item)."""
    rows = []
    for item in [[]] if items is None else items:
        with torch.inference_mode():
            logits = hf(torch.tensor([query + item], device="cuda")).logits[0, -1]
        rows.append(torch.log_softmax(logits.float(), -1)[LABELS].tolist())
    return rows


def test_adapters_on_an_fp8_base_score_as_on_the_bf16_base_within_the_fp8_bound(
        qwen3_path, adapters):
    """engine.precision fp8 with adapters: the GEMMs in FP8, each adapter's delta in bf16 on
    the rows the FP8 GEMM reads (gpu_worker/model/lora.py, Fp8LoraLinear). A mixed batch scores as
    on the bf16 base within the FP8-vs-bf16 bounds of test_gpu_matrix.py; each request replayed
    alone (a graph through the LoRA kernels) as the batch within its FP8 self bounds; and the
    adapters move the FP8 model's scores."""
    _, sequences, slots = mixed_workload()
    labels = [LABELS] * len(sequences)
    bf16 = engine_with(qwen3_path, adapters, GRAPHS)
    want = bf16.finish(bf16.launch(sequences, labels, adapters=slots))
    del bf16
    fp8 = engine_with(qwen3_path, adapters, GRAPHS.model_copy(update={"precision": "fp8"}))
    assert fp8.graphs.lora  # the FP8 linears run the LoRA kernels, so the graphs hold them
    mixed = fp8.finish(fp8.launch(sequences, labels, adapters=slots))
    within(mixed, want, FP8_VS_BF16, "fp8 base vs bf16 base, adapters mixed")
    assert all(fp8.plan([seq], [LABELS]).graph is not None for seq in sequences)
    replayed = [fp8.finish(fp8.launch([seq], [LABELS], adapters=[slot]))[0]
                for seq, slot in zip(sequences, slots)]
    within(replayed, mixed, SAME_FP8, "fp8 base: each replayed alone vs the mixed batch")
    plain = fp8.finish(fp8.launch(sequences, labels))
    moved = max(abs(a[0][0] - b[0][0]) for a, b, slot in zip(mixed, plain, slots) if slot)
    print(f"fp8 base: adapters move the first item's first label log-prob by up to {moved:.2f}")
    assert moved > SAME_FP8[0]


def test_a_prefix_cache_hit_of_an_adapter_scores_what_its_miss_did(qwen3_path, adapters):
    """The prefix cache keys a query on its adapter: the same query under adapter 1 and then the
    base is a miss each time, repeated a hit each; every hit scores as its miss (SAME_BF16)."""
    _, sequences, _ = mixed_workload()
    cached = GRAPHS.model_copy(update={"prefix_cache": PrefixCacheConfig(
        tokens=4096, min_tokens=64, min_query_share=0.0)})
    engine = engine_with(qwen3_path, adapters, cached)
    seq, stats = sequences[0], engine.prefix_cache.stats
    misses = [engine.finish(engine.launch([seq], [LABELS], adapters=[slot])) for slot in (1, 0)]
    assert (stats.misses, stats.hits) == (2, 0)
    hits = [engine.finish(engine.launch([seq], [LABELS], adapters=[slot])) for slot in (1, 0)]
    assert (stats.misses, stats.hits) == (2, 2)
    for slot, hit, miss in zip((1, 0), hits, misses):
        within(hit, miss, SAME_BF16, f"slot {slot}: hit vs miss")
    assert abs(misses[0][0][0][0] - misses[1][0][0][0]) > SAME_BF16[0]  # not the base's K/V


def test_a_classifier_adapters_own_head_in_a_batch_and_in_a_graph(tmp_path):
    """The 0.6B-shaped classifier with an adapter bringing its own trained head and one without
    (tests/support/adapters.py): a batch of both and the model's own requests
    (each row's head picked by its slot), each request replayed alone (the same in a CUDA graph)
    and a batch of one adapter (the head of its run) against HF fp32 logits of peft's
    merge_and_unload() of its adapter (or the model), within the bound of the first test."""
    from transformers import AutoModelForSequenceClassification

    folder = random_model_folder("0.6b-cls")
    merged_folders = [folder]
    for k, own_head in enumerate((True, False)):
        merged = write_classifier_adapter(folder, tmp_path / f"adapter{k}", own_head,
                                          seed=30 + k, rank=16)
        merged.save_pretrained(tmp_path / f"merged{k}")
        merged_folders.append(tmp_path / f"merged{k}")
    engine = Engine.from_config(folder, GRAPHS, lora=SLOTS)
    cfg = ModelConfig.from_folder(folder)
    for k in range(2):
        engine.add_adapter(load_adapter(tmp_path / f"adapter{k}", cfg, engine.dtype,
                                        engine.device))
    assert engine.adapters[0].head is not None and engine.adapters[1].head is None
    requests, sequences, slots = mixed_workload()
    classes = [list(range(cfg.num_labels))] * len(sequences)
    mixed = engine.finish(engine.launch(sequences, classes, adapters=slots))
    replayed = [engine.finish(engine.launch([seq], classes[:1], adapters=[slot]))[0]
                for seq, slot in zip(sequences, slots)]
    ones = [0 if slot != 1 else 1 for slot in slots]  # the model's and adapter 1's: its run
    one_run = engine.finish(engine.launch(sequences, classes, eager=True, adapters=ones))
    for k, folder_k in enumerate(merged_folders):
        hf = AutoModelForSequenceClassification.from_pretrained(
            folder_k, dtype=torch.float32).cuda().eval()
        want = []
        for query, items in requests:
            with torch.inference_mode():
                want.append([hf(torch.tensor([query + item], device="cuda")).logits[0].tolist()
                             for item in ([[]] if items is None else items)])
        del hf
        merged = Engine.from_config(folder_k, EngineConfig(device="cuda"))
        merged_error = differences(merged.finish(merged.launch(sequences, classes)), want)
        del merged
        bounds = tuple(max(own, 1.5 * e) for own, e in zip(SAME_BF16, merged_error))
        print(f"classifier slot {k}: the merged model's bf16 engine vs HF fp32: {merged_error}")
        for name, got, picked in (("mixed", mixed, slots), ("replayed", replayed, slots),
                                  ("one adapter's run", one_run, ones)):
            rows = [i for i, slot in enumerate(picked) if slot == k]
            within([got[i] for i in rows], [want[i] for i in rows], bounds,
                   f"classifier slot {k}, {name}, vs HF fp32")


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_after_warm_up_adapter_batches_compile_nothing(qwen3_path, adapters, precision):
    """A scorer warms its adapters up (gpu_worker/forward/startup.py::warm_up): afterwards batches
    of one adapter and of several, large and small, compile no Triton kernel."""
    from gpu_worker.forward.startup import triton_variants, warm_up

    engine = engine_with(qwen3_path, adapters, GRAPHS.model_copy(update={"precision": precision}))
    warm_up(engine, 16384, 4096)
    compiled = triton_variants()
    rng = random.Random(9)
    big = [pack_multi_item([rng.randrange(VOCAB) for _ in range(120)],
                           [[rng.randrange(VOCAB) for _ in range(180)] for _ in range(10)], 0)
           for _ in range(6)]
    for slots in ([2] * 6, [1] * 6, [0, 1, 2, 2, 1, 0], [1, 2]):
        engine.finish(engine.launch(big[:len(slots)], [LABELS] * len(slots), eager=True,
                                    adapters=slots))
    assert triton_variants() == compiled
