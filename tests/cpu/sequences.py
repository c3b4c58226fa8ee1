"""Packed sequences shared by the scheduler tests (fake engine) and the loop-parity test (real
engine)."""

import random

from ranker_contract.packing import PackedSequence, pack_multi_item, pack_plain


def mixed_sequences() -> list[PackedSequence]:
    """Eight requests' worth of sequences, 17 to 65 tokens, plain and multi-item mixed; token
    ids below 512 (the tiny checkpoints' vocabulary)."""
    rng = random.Random("scheduler")

    def toks(n: int) -> list[int]:
        return [rng.randrange(512) for _ in range(n)]

    seqs = []
    for k in range(8):
        if k % 3 == 2:
            seqs.append(pack_plain(toks(13 + 2 * k), 0))
        else:
            items = [toks(rng.randrange(0, 12)) for _ in range(1 + k % 4)]
            seqs.append(pack_multi_item(toks(20 + 3 * k), items, delimiter_id=1))
    return seqs
