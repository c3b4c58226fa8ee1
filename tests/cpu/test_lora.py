"""peft LoRA adapters read into the engine's packed linears (gpu_worker/model/lora.py): what they
add to each packed weight equals what peft's own merge_and_unload() adds, for adapters written by
peft itself on tiny seeded checkpoints; and the engine scores a sequence of an adapter as the
merged model does, with sequences of other adapters and of the base in the same batch."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from gpu_worker.forward.engine import Engine
from gpu_worker.model.decoder import PACKED_MODULES
from gpu_worker.model.fp8 import Fp8Linear, quantize_model
from gpu_worker.model.loader import load_model
from gpu_worker.model.lora import load_adapter
from ranker_contract.config import EngineConfig, Fp8Config
from ranker_contract.config import LoraConfig as Slots
from ranker_contract.model_config import ModelConfig, ModelFolderError
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.support.adapters import ALL, write_adapters, write_classifier_adapter

TOL = 1e-6


def write_adapter(base, folder, task_type=TaskType.CAUSAL_LM, **settings):
    """A seeded peft adapter of `base` (random A and B: init_lora_weights=False) saved to
    `folder`; returns the base model's projection weights before and after peft's merge."""
    torch.manual_seed(7)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = get_peft_model(base, LoraConfig(init_lora_weights=False, task_type=task_type,
                                                 **settings))
    peft_model.save_pretrained(folder)
    merged = peft_model.merge_and_unload().state_dict()
    return before, merged


def packed(state, layer, name):
    """The engine's packed weight of `name` in `layer`, from a checkpoint's state dict."""
    parts = PACKED_MODULES.get(name, (name,))
    block = "self_attn" if name in ("qkv_proj", "o_proj") else "mlp"
    return torch.cat([state[f"model.layers.{layer}.{block}.{p}.weight"] for p in parts])


@pytest.mark.parametrize("settings", [
    dict(r=4, lora_alpha=8, target_modules=ALL),
    dict(r=8, lora_alpha=16, target_modules=ALL, use_rslora=True),
    dict(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj", "up_proj"]),  # parts left out
], ids=["all", "rslora", "some"])
def test_each_packed_delta_equals_peft_merge(tiny_checkpoint, tmp_path, settings):
    folder = tiny_checkpoint("qwen3")
    before, merged = write_adapter(AutoModelForCausalLM.from_pretrained(folder), tmp_path,
                                   **settings)
    cfg = ModelConfig.from_folder(folder)
    adapter = load_adapter(tmp_path, cfg, torch.float32, torch.device("cpu"))
    names = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    for layer in range(cfg.num_hidden_layers):
        for name in names:
            want = packed(merged, layer, name) - packed(before, layer, name)
            pair = adapter.pairs.get((layer, name))
            got = pair.delta_weight() if pair else torch.zeros_like(want)
            assert (got - want).abs().max() <= TOL, (layer, name)
    assert adapter.rank == settings["r"]
    assert any(want.abs().max() > 0.1 for want in
               (packed(merged, 0, n) - packed(before, 0, n) for n in names))  # not a no-op


def test_a_classifiers_trained_head_comes_with_its_adapter(tiny_classifier, tmp_path):
    folder = tiny_classifier("qwen3_1class")
    base = AutoModelForSequenceClassification.from_pretrained(folder)
    _, merged = write_adapter(base, tmp_path, task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8,
                              target_modules=ALL)
    adapter = load_adapter(tmp_path, ModelConfig.from_folder(folder), torch.float32,
                           torch.device("cpu"))
    assert adapter.head is not None
    assert (adapter.head - merged["score.weight"]).abs().max() <= TOL


@pytest.mark.parametrize("setting, named", [
    ({"use_dora": True}, "use_dora"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "embed_tokens"),
    ({"alpha_pattern": {"q_proj": 32}}, "alpha_pattern"),
])
def test_what_cannot_be_applied_exactly_is_refused_naming_it(tiny_checkpoint, tmp_path,
                                                             setting, named):
    folder = tiny_checkpoint("qwen3")
    write_adapter(AutoModelForCausalLM.from_pretrained(folder), tmp_path,
                  **({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]} | setting))
    with pytest.raises(ModelFolderError, match=named):
        load_adapter(tmp_path, ModelConfig.from_folder(folder), torch.float32,
                     torch.device("cpu"))


def test_an_adapter_of_another_base_shape_is_refused(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("qwen3")
    write_adapter(AutoModelForCausalLM.from_pretrained(folder), tmp_path, r=4, lora_alpha=8,
                  target_modules=["q_proj"])
    cfg = ModelConfig.from_folder(folder)
    with pytest.raises(ModelFolderError, match="lora_B is"):  # q_proj's rows differ
        load_adapter(tmp_path, replace(cfg, num_attention_heads=2), torch.float32,
                     torch.device("cpu"))
    with pytest.raises(ModelFolderError, match="layer"):
        load_adapter(tmp_path, replace(cfg, num_hidden_layers=1), torch.float32,
                     torch.device("cpu"))


@pytest.fixture(scope="module")
def two_adapters(tiny_checkpoint, tmp_path_factory):
    """Two seeded peft adapters of the tiny qwen3 checkpoint (rank 4 on all seven projections;
    rank 8 on three), with an engine on each one's merge_and_unload(): (base folder, its
    config, the adapters' folders, the merged engines, the merged models' state dicts)."""
    base_folder = tiny_checkpoint("qwen3")
    made = write_adapters(base_folder, tmp_path_factory.mktemp("adapters"), {
        "adapter0": dict(r=4, lora_alpha=8, target_modules=ALL),
        "adapter1": dict(r=8, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"])},
        seed=11)
    folders = [adapter for adapter, _ in made.values()]
    merged_engines = [Engine.from_config(merged, EngineConfig()) for _, merged in made.values()]
    merged_states = [AutoModelForCausalLM.from_pretrained(merged).state_dict()
                     for _, merged in made.values()]
    return (base_folder, ModelConfig.from_folder(base_folder), folders, merged_engines,
            merged_states)


def worst_difference(got, want) -> float:
    """max |Δ log-prob| over sequences × items × labels of the same shape."""
    return max(abs(g - w) for gseq, wseq in zip(got, want, strict=True)
               for grow, wrow in zip(gseq, wseq, strict=True)
               for g, w in zip(grow, wrow, strict=True))


def test_the_engine_scores_an_adapter_as_peft_merged_and_mixes_adapters_in_one_batch(
        two_adapters):
    """Sequences of two adapters and of the base in one batch: each scores as the engine built
    on peft's merge_and_unload() of its adapter (or on the base) scores it alone, in fp32. Then
    a slot loaded over (an adapter unloaded for another) scores as the new adapter alone."""
    base_folder, cfg, folders, merged_engines, _ = two_adapters
    engine = Engine.from_config(base_folder, EngineConfig(), lora=Slots(slots=3, max_rank=8))
    slots = [engine.add_adapter(load_adapter(f, cfg, torch.float32, torch.device("cpu")))
             for f in folders]
    assert slots == [1, 2]
    rng = random.Random(3)

    def ids(n):
        return [rng.randrange(1, cfg.vocab_size) for _ in range(n)]

    sequences = [pack_multi_item(ids(9), [ids(5), ids(3), ids(7)], 0),
                 pack_plain(ids(12), 0), pack_multi_item(ids(6), [ids(4), ids(8)], 0),
                 pack_plain(ids(10), 0)]
    adapters = [1, 0, 2, 1]
    labels = [[3, 17]] * len(sequences)
    mixed = engine.finish(engine.launch(sequences, labels, adapters=adapters))
    alone = Engine.from_config(base_folder, EngineConfig())
    for seq, slot, got in zip(sequences, adapters, mixed, strict=True):
        reference = merged_engines[slot - 1] if slot else alone
        want = reference.finish(reference.launch([seq], [[3, 17]]))
        assert worst_difference([got], want) <= 1e-5, slot
    base_again = engine.finish(engine.launch(sequences, labels))
    plain = alone.finish(alone.launch(sequences, labels))
    assert base_again == plain  # without adapters the engine is the base model, bit for bit
    assert any(abs(a[0][0] - b[0][0]) > 1e-3 for a, b in zip(mixed, plain))  # adapters matter
    with pytest.raises(ValueError, match=r"in \[1, 2\]"):  # an empty slot is no silent base
        engine.launch(sequences[:1], labels[:1], adapters=[3])
    # adapter 1 (rank 8, three projections) over adapter 0 (rank 4, all seven) in slot 1:
    # nothing of the old one may remain
    engine.put_adapter(1, load_adapter(folders[1], cfg, torch.float32, torch.device("cpu")))
    reloaded = engine.finish(engine.launch(sequences, labels, adapters=[1, 0, 1, 2]))
    want = merged_engines[1].finish(merged_engines[1].launch(sequences, labels))
    assert max(abs(g - w) for k in (0, 2, 3) for grow, wrow in zip(reloaded[k], want[k])
               for g, w in zip(grow, wrow)) <= 1e-5
    small = Engine.from_config(base_folder, EngineConfig(), lora=Slots(slots=1, max_rank=4))
    with pytest.raises(ModelFolderError, match="rank 8 is above lora.max_rank 4"):
        small.add_adapter(load_adapter(folders[1], cfg, torch.float32, torch.device("cpu")))


def test_the_prefix_cache_keeps_each_adapters_query_apart(two_adapters):
    """One query under the base and two adapters: each is cached apart (a second batch hits all
    three, in another order) and each hit scores as its adapter's merged model, within the
    multi-item bound; after its slot is loaded over, the query under the new adapter is a miss,
    never the old adapter's K/V."""
    base_folder, cfg, folders, merged_engines, _ = two_adapters
    engine = Engine.from_config(
        base_folder, EngineConfig(prefix_cache={"tokens": 512, "min_tokens": 8,
                                                "page_tokens": 16}),
        lora=Slots(slots=2, max_rank=8))
    for folder in folders:
        engine.add_adapter(load_adapter(folder, cfg, torch.float32, torch.device("cpu")))
    rng = random.Random(5)

    def ids(n):
        return [rng.randrange(1, cfg.vocab_size) for _ in range(n)]

    query, labels = ids(40), [3, 17]
    alone = Engine.from_config(base_folder, EngineConfig())
    reference = {0: alone, 1: merged_engines[0], 2: merged_engines[1]}

    def run(adapters):
        sequences = [pack_multi_item(query, [ids(4), ids(6)], 0) for _ in adapters]
        got = engine.finish(engine.launch(sequences, [labels] * len(sequences),
                                          adapters=adapters))
        for seq, slot, scores in zip(sequences, adapters, got, strict=True):
            want = reference[slot].finish(reference[slot].launch([seq], [labels]))
            assert worst_difference([scores], want) <= 1e-5, (slot, adapters)
        return got

    first = run([1, 0, 2])
    stats = engine.prefix_cache.stats
    assert (stats.misses, stats.hits) == (3, 0)  # three owners: three entries
    run([2, 1, 0])
    assert (stats.misses, stats.hits) == (3, 3)
    assert abs(first[0][0][0] - first[1][0][0]) > 1e-3  # the adapter changes the scores
    engine.put_adapter(1, load_adapter(folders[1], cfg, torch.float32, torch.device("cpu")))
    reference[1] = merged_engines[1]
    run([1])
    assert (stats.misses, stats.hits) == (4, 3)


class MergedFp8(Fp8Linear):
    """The reference of an adapter on an FP8 linear: the FP8 linear's arithmetic off CUDA (the
    rows quantized, then dequantized, in fp32), on its dequantized weight plus peft's merged
    delta."""

    def __init__(self, fp8: Fp8Linear, delta: torch.Tensor) -> None:
        super().__init__(fp8.weight, fp8.weight_scale, fp8.bias, fp8.out_dtype)
        self.delta = delta

    def forward(self, rows, lora=None):  # a reference of the model alone: no adapters
        q, scale = rows
        weight = self.weight.float() * self.weight_scale.t() + self.delta
        return (q.float() * scale) @ weight.t()


def test_an_adapter_on_an_fp8_base_adds_peft_s_delta_to_the_rows_the_fp8_gemm_reads(
        two_adapters):
    """An FP8 base (simulated on CPU: the same e4m3 values and scales in fp32, the last layer
    left float) with two adapters, mixed with the base's sequences in one batch: each sequence
    scores as the FP8 model whose linears add peft's merged delta (merge_and_unload() minus
    the base) to their dequantized weights, in float."""
    base_folder, cfg, folders, _, merged_states = two_adapters
    cpu = torch.device("cpu")
    model = load_model(base_folder, torch.float32, cpu)
    quantize_model(model, Fp8Config(bf16_last_layers=1))
    plain = copy.deepcopy(model)
    base_state = AutoModelForCausalLM.from_pretrained(base_folder).state_dict()
    references = {0: Engine(copy.deepcopy(plain), cpu)}
    for slot, merged in enumerate(merged_states, 1):
        reference = copy.deepcopy(plain)
        for layer, decoder in enumerate(reference.model.layers):
            for parent, name in ((decoder.self_attn, "qkv_proj"), (decoder.self_attn, "o_proj"),
                                 (decoder.mlp, "gate_up_proj"), (decoder.mlp, "down_proj")):
                delta = packed(merged, layer, name) - packed(base_state, layer, name)
                linear = getattr(parent, name)
                if isinstance(linear, Fp8Linear):
                    setattr(parent, name, MergedFp8(linear, delta))
                else:
                    linear.weight.data += delta
        references[slot] = Engine(reference, cpu)
    engine = Engine(model, cpu, lora=Slots(slots=2, max_rank=8))
    assert {type(x).__name__ for x in engine._lora_linears.values()} == {"Fp8LoraLinear",
                                                                         "LoraLinear"}
    for folder in folders:
        engine.add_adapter(load_adapter(folder, cfg, torch.float32, cpu))
    rng = random.Random(9)

    def ids(n):
        return [rng.randrange(1, cfg.vocab_size) for _ in range(n)]

    sequences = [pack_multi_item(ids(9), [ids(5), ids(3), ids(7)], 0), pack_plain(ids(12), 0),
                 pack_multi_item(ids(6), [ids(4), ids(8)], 0), pack_plain(ids(10), 0)]
    adapters, labels = [1, 0, 2, 1], [[3, 17]] * len(sequences)
    got = engine.finish(engine.launch(sequences, labels, adapters=adapters))
    for seq, slot, scores in zip(sequences, adapters, got, strict=True):
        want = references[slot].finish(references[slot].launch([seq], labels[:1]))
        assert worst_difference([scores], want) <= 1e-5, slot
    base = references[0].finish(references[0].launch(sequences, labels))
    assert worst_difference(got[1:2], base[1:2]) <= 1e-5
    assert abs(got[0][0][0] - base[0][0][0]) > 1e-3  # the adapter moves the FP8 model's scores


def test_a_classifier_adapters_own_head_scores_its_rows_and_the_others_keep_the_models(
        tiny_classifier, tmp_path):
    """A three-class classifier with two adapters, one bringing its own trained head
    (modules_to_save) and one without (tests/support/adapters.py): in one
    batch with the model's own sequences, each scores as HF transformers' logits of peft's
    merge_and_unload() of its adapter (or of the model), in fp32; slot 1 loaded over with the
    headless adapter holds the model's head again."""
    folder = tiny_classifier("llama_3class")
    cfg = ModelConfig.from_folder(folder)
    folders = [tmp_path / "own_head", tmp_path / "no_head"]
    references = [AutoModelForSequenceClassification.from_pretrained(folder).eval(),
                  *(write_classifier_adapter(folder, f, own_head, seed=21 + k)
                    for k, (f, own_head) in enumerate(zip(folders, (True, False))))]
    adapters = [load_adapter(f, cfg, torch.float32, torch.device("cpu")) for f in folders]
    assert adapters[0].head is not None and adapters[1].head is None
    engine = Engine.from_config(folder, EngineConfig(), lora=Slots(slots=2, max_rank=4))
    for adapter in adapters:
        engine.add_adapter(adapter)
    rng = random.Random(4)

    def ids(n):
        return [rng.randrange(1, cfg.vocab_size) for _ in range(n)]

    requests = [(ids(8), [ids(5), ids(3)]), (ids(6), [ids(4)]), (ids(7), [ids(6), ids(2)]),
                (ids(9), [ids(3)])]
    slots = [1, 0, 2, 1]
    classes = [0, 1, 2]
    sequences = [pack_multi_item(q, items, 0) for q, items in requests]
    got = engine.finish(engine.launch(sequences, [classes] * 4, adapters=slots))

    def hf(model, query, items):
        with torch.inference_mode():
            return [model(torch.tensor([query + item])).logits[0].tolist() for item in items]

    for (query, items), slot, scores in zip(requests, slots, got, strict=True):
        assert worst_difference([scores], [hf(references[slot], query, items)]) <= 1e-4, slot
    engine.put_adapter(1, adapters[1])
    again = engine.finish(engine.launch(sequences[:1], [classes], adapters=[1]))
    assert worst_difference(again, [hf(references[2], *requests[0])]) <= 1e-4
