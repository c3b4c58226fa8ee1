"""The offline batch job on the GPU (ranker_batch.job.score_dataset on a local Ray, its scoring
actor on this GPU) against the same rows scored in this process by the request path the
service runs (serve_app/requests.py) and the shipped engine: equal within the bounds two bf16
engines keep from one another (tests/gpu/test_gpu_matrix.py, SAME_BF16: batches of other shapes
sum in another order). Token-id and text score rows, and rerank rows with a long document."""

import random

import pyarrow as pa
import pytest

from tests.gpu.conftest import LABELS, VOCAB, run_batch
from tests.gpu.test_gpu_matrix import SAME_BF16
from tools.configs import shipped_app_config
from tools.workload import WORDS


def words(rng, n):
    return " ".join(rng.choices(WORDS, k=n))


def rows(kind):
    rng = random.Random(kind)
    if kind == "ids":
        return [{"id": i, "query": rng.choices(range(VOCAB), k=rng.randint(20, 120)),
                 "items": [rng.choices(range(VOCAB), k=rng.randint(10, 180))
                           for _ in range(rng.randint(1, 12))], "label_token_ids": LABELS,
                 "apply_softmax": True} for i in range(40)]
    if kind == "text":
        return [{"id": i, "query": words(rng, rng.randint(5, 60)),
                 "items": [words(rng, rng.randint(5, 150)) for _ in range(rng.randint(1, 12))],
                 "label_token_ids": LABELS, "apply_softmax": True} for i in range(40)]
    return [{"id": i, "query": words(rng, 12),  # the first has a document of several chunks
             "documents": [words(rng, 40_000 if i == 0 and k == 0 else rng.randint(5, 300))
                           for k in range(rng.randint(2, 8))]} for i in range(10)]


@pytest.fixture(scope="module")
def config(qwen3_path):
    return shipped_app_config("score-gpu.yaml")


@pytest.fixture(scope="module")
def batch_results(config):
    import ray

    from ranker_batch.job import score_dataset

    ray.init(num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        out = {}
        for kind in ("ids", "text", "rerank"):
            ds = ray.data.from_arrow(pa.Table.from_pylist(rows(kind)))
            scored = score_dataset(ds, config, "rerank" if kind == "rerank" else "score",
                                   scorers=1)
            out[kind] = {r["id"]: r for r in scored.take_all()}
        return out
    finally:
        ray.shutdown()


@pytest.mark.parametrize("kind", ["ids", "text", "rerank"])
def test_each_row_equals_the_request_path_on_the_shipped_engine(config, batch_results,
                                                                fast_engine, kind):
    from serve_app.requests import RequestPath

    path = RequestPath(config)
    route = path.rerank["1"] if kind == "rerank" else path.score
    column = "relevance_scores" if kind == "rerank" else "scores"
    worst = 0.0
    for row in rows(kind):
        body = {k: v for k, v in row.items() if k != "id"}
        req = route.parse(body)
        tokens = route.tokenize_now(req)
        packed = path.pack(route, tokens)
        results = run_batch(fast_engine, packed.sequences, tokens.label_ids)
        want = path.respond(route, req, tokens, packed, results)
        got = batch_results[kind][row["id"]]
        assert got["error"] is None
        if kind == "rerank":
            by_index = {r["index"]: r["relevance_score"] for r in want["results"]}
            pairs = [(g, by_index[k]) for k, g in enumerate(got[column])]
        else:
            pairs = [(g, w) for grow, wrow in zip(got[column], want["scores"], strict=True)
                     for g, w in zip(grow, wrow, strict=True)]
        worst = max(worst, *(abs(g - w) for g, w in pairs))
    print(f"{kind}: max |Δ score| {worst:.2e}")
    assert worst <= SAME_BF16[1]
