"""peft LoRA adapters read into the engine's packed linears (gpu_worker/lora.py): what they add
to each packed weight equals what peft's own merge_and_unload() adds, for adapters written by
peft itself on tiny seeded checkpoints."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from gpu_worker.lora import load_adapter
from gpu_worker.model import PACKED_MODULES
from ranker_contract.model_config import ModelConfig, ModelFolderError

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
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
