"""The multi-item kernel's token-position rows, built on the host (gpu_worker/attention_flashinfer.py)."""

from gpu_worker.attention_flashinfer import token_pos_rows


def test_rows_are_padded_with_zeros_to_the_stride_one_after_another():
    rows = token_pos_rows([[1, 2], [], [3]], stride=3)
    assert rows.typecode == "H"  # uint16, as the kernel reads them
    assert list(rows) == [1, 2, 0, 0, 0, 0, 3, 0, 0]


def test_a_full_row_gets_no_padding_and_no_rows_give_nothing():
    assert list(token_pos_rows([[5, 6, 7]], stride=3)) == [5, 6, 7]
    assert list(token_pos_rows([], stride=4)) == []
