"""Batch compositions for the deterministic-scores tests (CPU and GPU): pairs packed into
requests, requests into batches, and each pair's label log-probs read back by its key."""

from __future__ import annotations

from ranker_contract.packing import pack_request


def pack(query: list[int], items: list[list[int]], max_seq_tokens: int = 8192):
    """One request's packed sequences (query first, delimiter 0)."""
    return pack_request(query, items, item_first=False, delimiter_id=0,
                        max_seq_tokens=max_seq_tokens, max_context=32768)


def score_batch(engine, batch, labels: list[int], eager: bool = False, adapter_of=None) -> dict:
    """`batch`: requests, each (its pair keys, its packed sequences), launched as one batch;
    `adapter_of(key)`: the LoRA adapter slot of a request, by its first pair's key (None: the
    model alone). Returns {pair key: label log-probs}."""
    sequences = [seq for _, seqs in batch for seq in seqs]
    adapters = ([adapter_of(keys[0]) for keys, seqs in batch for _ in seqs]
                if adapter_of else None)
    rows = engine.finish(engine.launch(sequences, [labels] * len(sequences), eager=eager,
                                       adapters=adapters))
    scores, at = {}, 0
    for keys, seqs in batch:
        items = [row for per_seq in rows[at:at + len(seqs)] for row in per_seq]
        at += len(seqs)
        scores.update(zip(keys, items, strict=True))
    return scores
