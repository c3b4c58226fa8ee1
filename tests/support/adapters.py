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
