"""The host tensors a batch's metadata is copied from (gpu_worker/forward/host_tensors.py)."""

import torch

from gpu_worker.forward.host_tensors import padded_int64_tensor


def test_unpadded_lists_keep_values_and_order():
    host = padded_int64_tensor([([5, -1], 2), ([2**40], 1)])
    assert host.dtype == torch.int64 and host.tolist() == [5, -1, 2**40]
    assert padded_int64_tensor([([], 0)]).tolist() == []


def test_padded_parts_sit_at_fixed_offsets_with_zeros_between():
    host = padded_int64_tensor([([7, 8], 4), ([], 2), ([9], 1), ([1, 2, 3], 5)])
    assert host.tolist() == [7, 8, 0, 0, 0, 0, 9, 1, 2, 3, 0, 0]


def test_padding_longer_than_the_zero_table_is_all_zeros():
    size = 200_000  # more than the 65,536 zeros the padding is first sliced from
    host = padded_int64_tensor([([4], size), ([6], 2)])
    assert host.shape == (size + 2,)
    assert host[0].item() == 4 and host[size].item() == 6
    assert host[1:size].count_nonzero().item() == 0 and host[size + 1].item() == 0
