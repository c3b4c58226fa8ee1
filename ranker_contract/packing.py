"""Multi-item packing: the contract between the ingress and the scorer replicas.

One request (query tokens Q of length P, items I_1..I_n) becomes one or more sequences
`Q D I_1 D I_2 ... D I_k D` (D = any valid token id; nothing attends to it). All metadata is
computed here from item lengths, in pure Python, so the worker never scans tokens:

- positions: query 0..P-1; token j (1-based) of every item at P+j-1; delimiters at P-1.
- block_ends: the rows split into attention blocks; block 0 is `Q D` (rows [0, P+1)), block k is
  I_k and the D after it. Block 0 attends causally within itself; every later block attends to
  the query (rows [0, prefix_len)) and causally within itself, so a row of I_k sees Q and I_k so
  far and never a delimiter or another item.
- score_rows: the last token of each item (index of the D after it, minus 1). An empty item scores
  at the last query token (P-1): the state after the query alone, which is what scoring Q + [] alone
  gives. (Its opening D would not do: a delimiter row has its own embedding.)
- A plain causal sequence (item_first, an empty query, or an item too long to share a sequence)
  has prefix_len = its length, one block (block_ends = [its length]) and one score row: its last
  token.

A sequence that would exceed `max_seq_tokens` is split at item boundaries; `item_offset` says
where its items sit in the request so results are merged back in order.
"""

from __future__ import annotations

import array
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PackedSequence:
    input_ids: list[int]
    positions: list[int]
    prefix_len: int  # the query's rows: every block after the first attends to them
    block_ends: list[int]  # end row (exclusive) of each attention block; the last is num_tokens
    score_rows: list[int]  # one per item, in item order
    item_offset: int  # index in the request of this sequence's first item

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_items(self) -> int:
        return len(self.score_rows)


class PackingError(ValueError):
    """An item that cannot be scored within the limits; `item_index` names it."""

    def __init__(self, message: str, item_index: int) -> None:
        super().__init__(message)
        self.item_index = item_index


def pack_plain(tokens: list[int], item_index: int) -> PackedSequence:
    """One causal sequence scored at its last token."""
    if not tokens:
        raise PackingError("query and item are both empty: nothing to score", item_index)
    n = len(tokens)
    return PackedSequence(
        input_ids=list(tokens),
        positions=list(range(n)),
        prefix_len=n,
        block_ends=[n],
        score_rows=[n - 1],
        item_offset=item_index,
    )


def pack_multi_item(
    query: list[int],
    items: list[list[int]],
    delimiter_id: int,
    item_offset: int = 0,
) -> PackedSequence:
    """`Q D I_1 D ... D I_n D` with the metadata described in the module docstring."""
    p = len(query)
    input_ids = list(query)
    positions = list(range(p))
    score_rows: list[int] = []
    delimiter_pos = max(p - 1, 0)  # unused by attention; any in-range position will do
    input_ids.append(delimiter_id)
    positions.append(delimiter_pos)
    block_ends = [p + 1]
    for k, item in enumerate(items):
        if not item and p == 0:
            raise PackingError("query and item are both empty: nothing to score", item_offset + k)
        input_ids.extend(item)
        positions.extend(range(p, p + len(item)))
        score_rows.append(len(input_ids) - 1 if item else p - 1)
        input_ids.append(delimiter_id)
        positions.append(delimiter_pos)
        block_ends.append(len(input_ids))
    return PackedSequence(
        input_ids=input_ids,
        positions=positions,
        prefix_len=p,
        block_ends=block_ends,
        score_rows=score_rows,
        item_offset=item_offset,
    )


def multi_item_length(query_len: int, item_lens: list[int]) -> int:
    """Tokens in `Q D I_1 D ... D I_n D`."""
    return query_len + sum(item_lens) + len(item_lens) + 1


def pack_request(
    query: list[int],
    items: list[list[int]],
    *,
    item_first: bool,
    delimiter_id: int,
    max_seq_tokens: int,
    max_context: int,
) -> list[PackedSequence]:
    """Pack one request into sequences of at most `max_seq_tokens` tokens, items kept in order.

    `max_context` bounds the positions of query + item (the model's context length). Nothing is
    truncated: an item that cannot fit raises PackingError naming it.
    """
    for k, item in enumerate(items):
        if len(query) + len(item) > max_context:
            raise PackingError(
                f"query + item is {len(query) + len(item)} tokens, more than the model's "
                f"context of {max_context}",
                k,
            )
    if item_first:
        return [_checked_plain(item + query, k, max_seq_tokens) for k, item in enumerate(items)]
    if not query:
        # No shared prefix to compute once: each item is its own causal sequence, so attention
        # costs each item's length squared instead of the whole packed length's.
        return [_checked_plain(item, k, max_seq_tokens) for k, item in enumerate(items)]

    sequences: list[PackedSequence] = []
    start = 0
    while start < len(items):
        end = start
        used = len(query) + 1  # query and the final delimiter
        while end < len(items) and used + len(items[end]) + 1 <= max_seq_tokens:
            used += len(items[end]) + 1
            end += 1
        if end == start:
            # Even alone this item overflows a multi-item sequence: score it as a plain one.
            sequences.append(_checked_plain(query + items[start], start, max_seq_tokens))
            start += 1
            continue
        sequences.append(pack_multi_item(query, items[start:end], delimiter_id, start))
        start = end
    return sequences


def _checked_plain(tokens: list[int], item_index: int, max_seq_tokens: int) -> PackedSequence:
    if len(tokens) > max_seq_tokens:
        raise PackingError(
            f"query + item is {len(tokens)} tokens, more than max_seq_tokens={max_seq_tokens}",
            item_index,
        )
    return pack_plain(tokens, item_index)


def cacheable_query(seq: PackedSequence, min_tokens: int, min_share: float) -> bool:
    """Whether a scorer may keep (and reuse) the K/V of `seq`'s query rows: a multi-item
    sequence whose query has at least `min_tokens` tokens and `min_share` of its tokens, and
    whose every item scores at an item row (an empty item scores at the query's last row, which
    a reuse does not compute)."""
    return (len(seq.block_ends) > 1 and seq.prefix_len >= min_tokens
            and seq.prefix_len >= min_share * seq.num_tokens
            and min(seq.score_rows) > seq.prefix_len)


def prefix_key(sequences: list[PackedSequence], min_tokens: int,
               min_share: float) -> str | None:
    """The routing key of a request whose query a scorer would cache: a digest of the query's
    ids, the same in every ingress process (Python's hash() is salted per process)."""
    if not sequences or not cacheable_query(sequences[0], min_tokens, min_share):
        return None
    query = sequences[0].input_ids[: sequences[0].prefix_len]
    return hashlib.blake2b(array.array("i", query).tobytes(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class ScoreJob:
    """What the ingress sends to a scorer replica for one request."""

    sequences: list[PackedSequence]
    label_ids: list[int]
    # Set when a scorer would cache the query: the request router sends equal keys to the
    # same replica (ranker_app/scorer_router.py).
    prefix_key: str | None = None
    adapter: int = 0  # the LoRA adapter: its index in AppConfig.model_names; 0: the model itself
    # One of AppConfig.models, by name: the scorer replica loads it if need be (Serve's model
    # multiplexing); None: model_path's model (or its adapter).
    model: str | None = None
    # Whose prefix-cache entries the job reads and fills (AuthConfig.cache_owner): a query
    # another tenant cached is a miss here. "": auth off, one tenant.
    cache_owner: str = ""
    # The key's priority class (docs/OPERATIONS.md, "Priorities"): bulk work runs in what
    # online work leaves, with a floor share of each batch, and is refused first.
    bulk: bool = False


@dataclass(frozen=True, slots=True)
class ScoredJob:
    """A scorer replica's answer to a ScoreJob, with where the job's time in the replica went."""

    results: list[list[list[float]]]  # per sequence: items × label log-probs
    queued_s: float  # from reaching the replica's queue to the launch of its first batch
    computed_s: float  # from that launch to its last result (the batch in front included)


def merge_results(
    sequences: list[PackedSequence], results: list[list[list[float]]], num_items: int
) -> list[list[float]]:
    """Per-sequence rows (items × labels) back into request item order."""
    merged: list[list[float]] = [[] for _ in range(num_items)]
    for seq, rows in zip(sequences, results, strict=True):
        for k, row in enumerate(rows):
            merged[seq.item_offset + k] = row
    return merged
