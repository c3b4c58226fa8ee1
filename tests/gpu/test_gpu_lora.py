"""LoRA adapters on the GPU engine (bf16, FlashInfer, the fused kernels, CUDA graphs on): a batch
mixing two adapters and the base scores each sequence as the engine built on peft's
merge_and_unload() of its adapter (or on the base) scores it alone, within the bounds two bf16
engines keep from one another (tests/gpu/test_gpu_matrix.py, SAME_BF16); base batches still
replay their graphs."""

import random

import pytest
import torch

from gpu_worker.engine import Engine
from gpu_worker.lora import load_adapter
from ranker_contract.config import EngineConfig
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import pack_multi_item, pack_plain
from tests.gpu.conftest import LABELS, VOCAB
from tests.gpu.test_gpu_matrix import SAME_BF16, within

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GRAPHS = EngineConfig(device="cuda", cuda_graphs={"enabled": True, "token_buckets": [512, 1024]})


@pytest.fixture(scope="module")
def adapters(qwen3_path, tmp_path_factory):
    """Two seeded rank-16 adapters of the 0.6B model: (adapter folder, merged folder) each."""
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
        model.merge_and_unload().to(torch.bfloat16).save_pretrained(folder / "merged")
        made.append((folder / "adapter", folder / "merged"))
    return made


def test_mixed_adapters_in_one_batch_score_as_each_merged_model(qwen3_path, adapters):
    engine = Engine.from_config(qwen3_path, GRAPHS)
    cfg = ModelConfig.from_folder(qwen3_path)
    for folder, _ in adapters:
        engine.add_adapter(load_adapter(folder, cfg, engine.dtype, engine.device))
    rng = random.Random(5)

    def ids(n):
        return [rng.randrange(VOCAB) for _ in range(n)]

    sequences = [pack_multi_item(ids(120), [ids(180) for _ in range(10)], 0),
                 pack_plain(ids(300), 0), pack_multi_item(ids(60), [ids(90) for _ in range(6)], 0),
                 pack_multi_item(ids(120), [ids(180) for _ in range(10)], 0)]
    slots = [1, 0, 2, 1]
    mixed = engine.finish(engine.launch(sequences, [LABELS] * 4, adapters=slots))
    references = [Engine.from_config(qwen3_path, EngineConfig(device="cuda")),
                  *(Engine.from_config(merged, EngineConfig(device="cuda"))
                    for _, merged in adapters)]
    for seq, slot, got in zip(sequences, slots, mixed, strict=True):
        ref = references[slot]
        want = ref.finish(ref.launch([seq], [LABELS]))
        within([got], want, SAME_BF16, f"slot {slot}")
    moved = max(abs(a[0][0] - b[0][0]) for a, b in
                zip(mixed, references[0].finish(references[0].launch(sequences, [LABELS] * 4))))
    assert moved > SAME_BF16[0]  # the adapters change the scores
    base = engine.finish(engine.launch(sequences[1:2], [LABELS]))  # a lone base request: replay
    within(base, references[0].finish(references[0].launch(sequences[1:2], [LABELS])),
           SAME_BF16, "base, replayed")
