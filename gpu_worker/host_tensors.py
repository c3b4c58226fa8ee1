"""Host tensors from the ingress's Python int lists, built without torch's per-element path."""

from __future__ import annotations

import array

import torch


def int64_tensor(values: list[int], pin: bool = False) -> torch.Tensor:
    """A fresh int64 CPU tensor of `values` (pinned when `pin`, for a non-blocking copy).

    Going through array.array is ~4x faster than torch.tensor(list) for the thousands of ids of
    a batch: on a lone request that is host time the GPU waits for.
    """
    host = torch.frombuffer(array.array("q", values), dtype=torch.int64) if values else (
        torch.empty(0, dtype=torch.int64))
    return host.pin_memory() if pin else host
