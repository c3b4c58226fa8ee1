"""Load an HF model folder (config.json + *.safetensors) into CausalLMForScoring, or into
SequenceClassifierForScoring for a `*ForSequenceClassification` folder
(gpu_worker/model/heads.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from gpu_worker.model.decoder import PACKED_MODULES, CausalLMForScoring
from gpu_worker.model.fp8_checkpoint import Fp8Checkpoint, load_dtype
from gpu_worker.model.heads import SequenceClassifierForScoring, classifier_from_label_rows
from ranker_contract.model_config import ModelConfig, ModelFolderError

logger = logging.getLogger(__name__)


ScoringModel = CausalLMForScoring | SequenceClassifierForScoring


def load_model(folder: str | Path, dtype: torch.dtype, device: torch.device,
               precision: str = "bf16", dequantize_fp8: bool = False,
               head_from_labels: tuple[int, int] | None = None) -> ScoringModel:
    """`precision` and `dequantize_fp8` (engine.fp8.dequantize_checkpoint) decide how an FP8
    checkpoint loads (gpu_worker/model/fp8_checkpoint.py); a bf16 checkpoint ignores them.
    `head_from_labels`: (yes, no) token ids; the causal LM is served as a one-class
    classifier of those rows of its LM head
    (gpu_worker/model/heads.py::classifier_from_label_rows)."""
    folder = Path(folder)
    cfg = ModelConfig.from_folder(folder)
    if head_from_labels is not None:
        cfg.with_label_head()  # a classifier folder is refused here, naming the setting
    fp8 = Fp8Checkpoint.from_folder(folder, dtype, precision, dequantize_fp8)
    files = _safetensors_files(folder)
    with torch.device("meta"):
        model = SequenceClassifierForScoring(cfg) if cfg.is_classifier else CausalLMForScoring(cfg)
    state: dict[str, torch.Tensor] = {}
    for f in files:  # straight onto the device: packing and casting there is fast
        state.update(load_file(f, device=str(device)))
    if fp8 is not None:
        state = fp8.prepare(state)
    if cfg.tie_word_embeddings or cfg.is_classifier:
        # A classifier never reads an LM head (HF ignores one left in a converted folder too).
        state.pop("lm_head.weight", None)
    # Old checkpoints store RoPE frequencies; we compute them from the config.
    state = _pack({k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")})
    if fp8 is not None:
        fp8.install(model, state, device)
    tied_head = cfg.tie_word_embeddings
    expected = {k for k in model.state_dict() if not (tied_head and k == "lm_head.weight")}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    if missing or unexpected:
        raise ModelFolderError(
            f"{folder}: weights do not match a {cfg.model_type} model: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    if cfg.is_classifier and state["score.weight"].shape != model.score.weight.shape:
        raise ModelFolderError(
            f"{folder}: score.weight is {list(state['score.weight'].shape)}, but config.json "
            f"names {cfg.num_labels} classes of hidden size {cfg.hidden_size} (id2label)")
    state = {k: v.to(device=device, dtype=load_dtype(k, v, dtype)) for k, v in state.items()}
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings and not cfg.is_classifier:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.to(device).eval()
    if head_from_labels is not None:
        model = classifier_from_label_rows(model, *head_from_labels)
        cfg = model.config
    logger.info("loaded %s (%s, %d layers, %s) as %s on %s", folder, cfg.model_type,
                cfg.num_hidden_layers,
                f"{cfg.num_labels}-class head" if cfg.is_classifier else "LM head", dtype, device)
    return model


def _pack(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stack q/k/v and gate/up weights (and biases) into the packed parameters."""
    for packed, parts in PACKED_MODULES.items():
        for key in [k for k in state if f".{parts[0]}." in k]:
            names = [key.replace(f".{parts[0]}.", f".{part}.") for part in parts]
            if all(n in state for n in names):
                state[key.replace(f".{parts[0]}.", f".{packed}.")] = torch.cat(
                    [state.pop(n) for n in names], dim=0)
    return state


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"no *.safetensors weights in {folder}")
    return files
