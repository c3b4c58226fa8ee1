"""Our engine (fp32, torch attention) against HF transformers (fp32) on the same checkpoint.

Every model family we serve, and the real default model, is scored as plain sequences, as one
multi-item sequence, and as a mixed batch; each label log-prob must match
`log_softmax(hf(query + item).logits[0, -1])` over the full vocabulary within 1e-4. Last, the
engine through the scheduling loop scores like the engine alone.
"""

from __future__ import annotations

import queue
import random
from dataclasses import dataclass, field

import pytest
import torch

from gpu_worker.forward.engine import Engine
from gpu_worker.serving.scheduler import Scheduler, ScoreTask
from ranker_contract.config import SchedulerConfig
from ranker_contract.packing import PackedSequence, pack_multi_item, pack_plain
from tests.cpu.sequences import mixed_sequences

TOL = 1e-4
# Keys of conftest.TINY_FAMILIES: every architecture variant the loader must handle.
TINY_FAMILY_NAMES = ("llama", "llama_untied", "llama3_rope", "qwen2", "qwen3")
# Different lengths, an empty item (scored at the query's last token) and a one-token item.
ITEM_LENS = (6, 0, 11, 1)
QUERY_LEN = 30


@dataclass
class Case:
    engine: Engine
    hf: torch.nn.Module
    vocab: int
    labels: list[int]
    delimiter: int
    query: list[int]
    items: list[list[int]]
    # HF forwards dominate the real model's test time; the three tests share most references.
    hf_cache: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    def hf_logprobs(self, tokens: list[int], labels: list[int]) -> list[float]:
        """HF's full-vocabulary log-probs of `labels` after the last token of `tokens`."""
        key = tuple(tokens)
        if key not in self.hf_cache:
            with torch.inference_mode():
                out = self.hf(torch.tensor([tokens]), use_cache=False, logits_to_keep=1)
                logits = out.logits[0, -1].float()
            self.hf_cache[key] = torch.log_softmax(logits, dim=-1)
        return self.hf_cache[key][labels].tolist()


def assert_close(ours: list[float], ref: list[float], what: str) -> None:
    diff = max(abs(a - b) for a, b in zip(ours, ref, strict=True))
    assert diff <= TOL, f"{what}: max |Δ logprob| = {diff:.2e} > {TOL}"


@pytest.fixture(scope="module", params=[*TINY_FAMILY_NAMES, "default"])
def case(request, tiny_checkpoint, default_model_path, engine_for, hf_model_for) -> Case:
    if request.param == "default":
        path = default_model_path
    else:
        path = tiny_checkpoint(request.param)
    engine = engine_for(path)
    vocab = engine.vocab_size
    rng = random.Random(f"parity-{request.param}")
    labels = [0, vocab - 1, rng.randrange(vocab)]
    if request.param == "default":
        labels += [10539, 5230]  # "Yes", "No"

    def tokens(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    return Case(
        engine=engine,
        hf=hf_model_for(path),
        vocab=vocab,
        labels=labels,
        delimiter=rng.randrange(vocab),
        query=tokens(QUERY_LEN),
        items=[tokens(n) for n in ITEM_LENS],
    )


def test_plain_sequences_match_hf(case: Case, score_sequences):
    seqs = [pack_plain(case.query + item, k) for k, item in enumerate(case.items)]
    results = score_sequences(case.engine, seqs, case.labels)
    for k, (item, rows) in enumerate(zip(case.items, results, strict=True)):
        assert len(rows) == 1
        assert_close(rows[0], case.hf_logprobs(case.query + item, case.labels), f"item {k}")


def test_multi_item_sequence_matches_hf(case: Case, score_sequences):
    seq = pack_multi_item(case.query, case.items, case.delimiter)
    (rows,) = score_sequences(case.engine, [seq], case.labels)
    assert len(rows) == len(case.items)
    for k, item in enumerate(case.items):
        # An empty item must score exactly like the query alone.
        ref = case.hf_logprobs(case.query + item, case.labels)
        assert_close(rows[k], ref, f"item {k} (len {len(item)})")


def test_mixed_batch_matches_hf(case: Case):
    """Plain and multi-item sequences with different queries and label lists in one launch."""
    rng = random.Random("mixed")
    query2 = [rng.randrange(case.vocab) for _ in range(17)]
    items2 = [[rng.randrange(case.vocab) for _ in range(n)] for n in (3, 9, 0)]
    one_label = case.labels[-1:]
    jobs = [  # (sequence, labels, reference token lists per item)
        (pack_plain(query2 + items2[0], 0), case.labels, [query2 + items2[0]]),
        (pack_multi_item(case.query, case.items, case.delimiter), case.labels,
         [case.query + item for item in case.items]),
        (pack_multi_item(query2, items2, case.delimiter), one_label,
         [query2 + item for item in items2]),
        # item_first: item + query as its own plain causal sequence
        (pack_plain(case.items[2] + case.query, 0), one_label, [case.items[2] + case.query]),
    ]
    step = case.engine.launch([seq for seq, _, _ in jobs], [labels for _, labels, _ in jobs])
    results = case.engine.finish(step)
    assert len(results) == len(jobs)
    for j, ((_, labels, refs), rows) in enumerate(zip(jobs, results, strict=True)):
        assert len(rows) == len(refs)
        for k, (row, ref_tokens) in enumerate(zip(rows, refs, strict=True)):
            assert_close(row, case.hf_logprobs(ref_tokens, labels), f"sequence {j} item {k}")


def _through_the_loop(engine: Engine, sequences: list[PackedSequence], labels: list[int]
                      ) -> tuple[list, Scheduler]:
    """Every sequence queued before the loop starts (so the batches are the same in every run):
    results in submission order, and the loop that ran them."""
    done: queue.Queue = queue.Queue()
    scheduler = Scheduler(engine, SchedulerConfig(max_batch_sequences=3, overlap=True),
                          batch_token_budget=120)
    for i, seq in enumerate(sequences):
        scheduler.submit(ScoreTask(seq, labels, lambda result, i=i: done.put((i, result))))
    scheduler.start()
    try:
        results = dict(done.get(timeout=30) for _ in sequences)
    finally:
        scheduler.stop()
    return [results[i] for i in range(len(sequences))], scheduler


def test_the_loop_scores_like_the_engine_alone(tiny_checkpoint, engine_for, score_sequences):
    """The real engine in the scheduling loop, over several batches: each sequence scores as it
    does launched alone. On the CPU the engine's launch computes the batch, so the loop never
    overlaps, whatever `overlap` says (the GPU tests compare overlap with synchronous)."""
    engine, labels, sequences = engine_for(tiny_checkpoint("llama")), [0, 5, 511], mixed_sequences()
    looped, scheduler = _through_the_loop(engine, sequences, labels)
    assert scheduler.batches_run > 1 and not scheduler.overlap
    alone = [score_sequences(engine, [seq], labels)[0] for seq in sequences]
    for got, want in zip(looped, alone, strict=True):
        assert len(got) == len(want)
        assert max(abs(a - b) for ra, rb in zip(got, want) for a, b in zip(ra, rb)) <= 1e-5
