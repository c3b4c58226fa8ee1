"""LoRA adapters written by peft itself for the service tests: seeded, with random A and B
(init_lora_weights=False), so that they move scores clearly."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapters(base: Path, folder: Path, settings: dict[str, dict], seed: int = 100
                   ) -> dict[str, tuple[Path, Path]]:
    """name -> (its peft adapter folder, peft's merge_and_unload() of it) under `folder`, one
    adapter of `base` per entry of `settings` (LoraConfig's arguments)."""
    made = {}
    for k, (name, lora) in enumerate(settings.items()):
        torch.manual_seed(seed + k)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(init_lora_weights=False, **lora))
        model.save_pretrained(folder / name / "adapter")
        model.merge_and_unload().save_pretrained(folder / name / "merged")
        made[name] = (folder / name / "adapter", folder / name / "merged")
    return made


def write_classifier_adapter(base: Path, folder: Path, own_head: bool, seed: int, rank: int = 4):
    """A seeded peft SEQ_CLS adapter of the classifier `base`, rank `rank` on all seven
    projections, saved to `folder`: with its own trained head (drawn at random at the scale of
    the model's, as training would move it) or without one (peft saves the model's head anyway:
    taken out of the file). Returns peft's merge_and_unload() of it, in eval mode."""
    from peft import TaskType
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForSequenceClassification.from_pretrained(base),
                           LoraConfig(init_lora_weights=False, task_type=TaskType.SEQ_CLS, r=rank,
                                      lora_alpha=2 * rank, target_modules=ALL))
    if own_head:
        head = model.base_model.model.score.modules_to_save["default"].weight
        head.data = torch.randn_like(head) * head.std()
    model.save_pretrained(folder)
    if not own_head:
        path = folder / "adapter_model.safetensors"
        save_file({key: value for key, value in load_file(path).items()
                   if not key.endswith("score.weight")}, path)
    return model.merge_and_unload().eval()
