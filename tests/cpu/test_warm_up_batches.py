"""The warm-up's batches (gpu_worker/forward/startup.py) cover what a batch under load can be: both
token-total parities at the budget and small, multi-item and plain layouts, the longest sequence,
and nothing the scheduler or the ingress would not send."""

from pathlib import Path

import pytest

from gpu_worker.forward.startup import WARMED_KERNELS, cached_warm_up_batches, warm_up_batches
from ranker_contract.packing import cacheable_query


@pytest.mark.parametrize("budget, max_seq", [(32768, 16384), (65536, 4096), (4096, 4096),
                                             (20000, 16384)])
def test_batches_cover_every_variant_within_the_limits(budget, max_seq):
    batches = warm_up_batches(budget, max_seq)
    totals = [sum(s.num_tokens for s in batch) for batch in batches]
    sequences = [s for batch in batches for s in batch]
    assert max(totals) == budget and all(t <= budget for t in totals)
    assert {budget, budget - 1} <= set(totals)  # both parities; the fused gate/up from 8192
    assert {t % 2 for t in totals if t < 1024} == {0, 1}
    assert all(s.num_tokens <= max_seq for s in sequences)
    assert max(s.num_tokens for s in sequences) == max_seq
    multi_item = [s for s in sequences if s.num_items > 1]
    plain = [s for s in sequences if len(s.block_ends) == 1]
    assert multi_item and plain
    assert max(s.num_tokens for s in multi_item) > max_seq - 200  # a long query's attention
    for s in sequences:  # well-formed: positions restart per item block, rows inside
        assert len(s.positions) == s.num_tokens and s.block_ends[-1] == s.num_tokens
        assert all(0 <= r < s.num_tokens for r in s.score_rows)


@pytest.mark.parametrize("min_tokens, min_share, max_seq", [
    (64, 0.2, 16384), (64, 0.0, 16384), (1000, 0.5, 4096), (64, 0.9, 16384), (64, 0.2, 600)])
def test_the_cache_warm_up_fills_then_reads_a_query_the_cache_keeps(min_tokens, min_share,
                                                                      max_seq):
    """With the prefix cache on, the warm-up must run a batch that reads it (the pass over the
    pool and the merge are built on first use): its query must pass both of the cache's rules."""
    fill, read = cached_warm_up_batches(32768, max_seq, min_tokens, min_share)
    (seq,) = fill
    assert cacheable_query(seq, min_tokens, min_share) and seq.num_tokens <= max_seq
    assert all(s is seq for s in read) and sum(s.num_tokens for s in read) <= 32768


def test_no_cache_warm_up_when_no_query_can_be_kept():
    assert cached_warm_up_batches(32768, 16384, 64, 1.0) == []  # a query is never all tokens
    assert cached_warm_up_batches(32768, 300, 400, 0.2) == []  # longer than any sequence


def test_the_kernels_whose_variants_are_counted_are_modules_of_gpu_worker_kernels():
    """triton_variants() looks each name up among the loaded modules: a name left behind by a
    rename would count no variant ever, and the GPU tests that no batch compiles a kernel after
    warm-up would pass on nothing."""
    kernels = Path(__file__).resolve().parents[2] / "gpu_worker" / "kernels"
    missing = [name for name in WARMED_KERNELS if not (kernels / f"{name}.py").is_file()]
    assert WARMED_KERNELS and not missing
