"""Host tensors from the ingress's Python int lists, built without torch's per-element path."""

from __future__ import annotations

import array

import torch

# Padding of a CUDA graph's inputs is sliced from here (one memory copy), not converted per int.
_ZEROS = array.array("q", bytes(8 << 16))


def padded_int64_tensor(parts: list[tuple[list[int], int]], pin: bool = False) -> torch.Tensor:
    """One fresh int64 CPU tensor of the lists in order, each followed by zeros up to its size
    (a CUDA graph's fixed input layout; size = len(list): no padding); pinned when `pin`, for one
    non-blocking copy of the whole batch's metadata.

    Going through array.array, not torch.tensor(list) (which converts element by element), for
    the thousands of ids of a batch: on a lone request that is host time the GPU waits for
    (docs/ARCHITECTURE.md, "CUDA graphs").
    """
    out = array.array("q")
    for values, size in parts:
        out.fromlist(values)
        pad = size - len(values)
        if pad > len(_ZEROS):
            _ZEROS.frombytes(bytes(8 * (pad - len(_ZEROS))))
        out.extend(_ZEROS[:pad])
    host = torch.frombuffer(out, dtype=torch.int64) if out else torch.empty(0, dtype=torch.int64)
    return host.pin_memory() if pin else host
