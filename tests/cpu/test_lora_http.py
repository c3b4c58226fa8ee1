"""Several rankers behind one service: LoRA adapters of the served model, picked by a request's
`model` (configs/score.yaml on the small random model, with three adapters peft wrote and two
adapter slots, so the third loads on first use). Each adapter scores as HF transformers scores
peft's merge_and_unload() of it; requests of the base and every adapter sent together (so
batches mix them, and adapters are unloaded and loaded again under load) score as each sent
alone; an unknown name is a 404 naming `model`; the ingress metrics count requests and items
by model, the scorer's the adapters loaded and unloaded; the prefix cache keeps an adapter's
query apart from the model's."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ranker_contract.config import YES_NO_PROMPT, RerankPrompt
from tests.support.adapters import ALL, write_adapters
from tools.prom import scrape
from tools.service import FAST_METRICS_ENV, serving, small_model_config, wait_until

pytestmark = pytest.mark.service

ADAPTERS = {"ranker-a": dict(r=8, lora_alpha=16, target_modules=ALL),
            "ranker-b": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                             use_rslora=True),
            "ranker-c": dict(r=16, lora_alpha=32, target_modules=["o_proj", "gate_proj",
                                                                  "up_proj"])}
# ranker-c's own rerank prompt (the others read the model's, YES_NO_PROMPT)
OWN_PROMPT = RerankPrompt(prefix="Question: {query}\nTask: {instruction}\nPassage: ",
                          suffix="\nIs the passage relevant, yes or no?\nAnswer:",
                          yes_label="yes", no_label="no",
                          default_instruction="Judge the passage.")
LABELS = [10539, 5230]  # " Yes", " No" in the small model's (SmolLM2's) vocabulary
QUERY = "Is the sky blue on a clear day?"
ITEMS = ["Yes, the sky is blue.", "No.", "Grass is green and the sea is wide."]
TOL = 1e-4  # fp32 engine against HF fp32, as the engine parity tests


@pytest.fixture(scope="module")
def rankers(small_model, tmp_path_factory):
    """name -> (adapter folder, merged model folder)."""
    return write_adapters(small_model, tmp_path_factory.mktemp("rankers"), ADAPTERS)


@pytest.fixture(scope="module")
def service(small_model, rankers):
    config = small_model_config(small_model)
    config["applications"][0]["args"]["adapters"] = [
        {"name": name, "path": str(adapter)} for name, (adapter, _) in rankers.items()]
    config["applications"][0]["args"]["lora"] = {"slots": 2}
    config["applications"][0]["args"]["engine"]["prefix_cache"] = {"tokens": 4096}
    config["applications"][0]["args"]["adapters"][2]["rerank"] = {
        "template": "custom", "prompt": OWN_PROMPT.model_dump()}
    with serving(config, FAST_METRICS_ENV) as running:
        yield running


@pytest.fixture(scope="module")
def http(service):
    with httpx.Client(base_url=service.url, timeout=120) as c:
        yield c


def score(http, model=None, query=QUERY, items=ITEMS):
    body = {"query": query, "items": items, "label_token_ids": LABELS}
    r = http.post("/v1/score", json=body | ({"model": model} if model else {}))
    assert r.status_code == 200, r.text
    return r.json()["scores"]


def wait_for_growth(counts, before: dict, want: dict, what: str, service) -> None:
    """Wait until `counts()` has grown from `before` by exactly `want` (key -> growth)."""
    seen: dict = {}

    def counted() -> bool:
        now = counts()
        seen.update({k: now.get(k, 0) - before.get(k, 0) for k in want})
        return seen == want

    try:
        wait_until(counted, 60, what, service)
    except TimeoutError:
        pytest.fail(f"counted {seen}, not {want}")


def hf_logprobs(folder, tokenizer_folder, text_pairs):
    """Label log-probs of HF transformers (fp32) after each (query, item) text, tokenized as
    the service tokenizes /v1/score text: the query with special tokens, the item without."""
    tok = AutoTokenizer.from_pretrained(tokenizer_folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    out = []
    for query, item in text_pairs:
        ids = (tok(query, add_special_tokens=True)["input_ids"]
               + tok(item, add_special_tokens=False)["input_ids"])
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        out.append(torch.log_softmax(logits, -1)[LABELS].tolist())
    return out


def test_metrics_count_requests_and_items_by_model(service, http):
    """Every model's series exist from start-up; a request counts under the name it resolved to
    (no `model`: the served model), one refused before its model was known under "-". First in
    the module: no other test's requests are still on their way to the metrics."""
    served = http.get("/v1/models").json()["data"][0]["id"]

    def counts() -> dict[tuple[str, str, str], float]:
        """(metric, model, status) -> value, summed over replicas, routes and keys."""
        out: dict[tuple[str, str, str], float] = {}
        for name, labels, value in scrape(service.metrics_url()):
            if name in ("ray_ranker_requests_total", "ray_ranker_items_total") and \
                    labels.get("deployment") == "ScoreIngress":
                key = (name, labels["model"], labels.get("status", ""))
                out[key] = out.get(key, 0.0) + value
        return out

    reads = [counts()]
    wait_until(lambda: reads.append(counts()) or len({m for _, m, _ in reads[-1]}) == 5, 60,
               "every model's series declared", service)
    before = reads[-1]
    assert {model for _, model, _ in before} == {served, *ADAPTERS, "-"}
    for model in ("ranker-a", "ranker-a", None):
        score(http, model)
    assert http.post("/v1/score", json={"query": "q", "items": ["a"], "label_token_ids": LABELS,
                                        "model": "ranker-z"}).status_code == 404
    want = {("ray_ranker_requests_total", "ranker-a", "200"): 2,
            ("ray_ranker_requests_total", served, "200"): 1,
            ("ray_ranker_requests_total", "-", "404"): 1,
            ("ray_ranker_items_total", "ranker-a", ""): 2 * len(ITEMS),
            ("ray_ranker_items_total", served, ""): len(ITEMS),
            ("ray_ranker_items_total", "ranker-b", ""): 0}
    wait_for_growth(counts, before, want, "requests and items counted by model", service)


def test_models_lists_the_model_and_its_adapters(http):
    names = [m["id"] for m in http.get("/v1/models").json()["data"]]
    assert names == ["small-random", *ADAPTERS]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_an_adapter_scores_as_hf_on_peft_merged_weights(http, rankers, small_model, name):
    got = score(http, name)
    want = hf_logprobs(rankers[name][1], small_model, [(QUERY, item) for item in ITEMS])
    for row, ref in zip(got, want, strict=True):
        assert [math.log(p) for p in row] == pytest.approx(ref, abs=TOL)
    base = score(http)
    assert max(abs(math.log(a[0]) - math.log(b[0])) for a, b in zip(got, base)) > 1e-2


def test_the_model_by_its_name_or_no_name_is_the_base(http, small_model):
    want = hf_logprobs(small_model, small_model, [(QUERY, item) for item in ITEMS])
    for got in (score(http), score(http, "small-random")):
        for row, ref in zip(got, want, strict=True):
            assert [math.log(p) for p in row] == pytest.approx(ref, abs=TOL)


@pytest.mark.parametrize(("name", "prompt"), [("ranker-b", YES_NO_PROMPT),
                                            ("ranker-c", OWN_PROMPT)])
def test_rerank_with_an_adapter_reads_its_template_through_the_adapter(http, rankers,
                                                                       small_model, name, prompt):
    """The model's rerank prompt, or the adapter's own where it has one (ranker-c)."""
    docs = ["The sky is blue because air scatters blue light.", "Bananas are yellow."]
    r = http.post("/v2/rerank", json={"model": name, "query": QUERY, "documents": docs})
    assert r.status_code == 200, r.text
    got = {res["index"]: res["relevance_score"] for res in r.json()["results"]}
    prefix = prompt.prefix.format(query=QUERY, instruction=prompt.default_instruction)
    tok = AutoTokenizer.from_pretrained(small_model)
    yes, no = (tok.convert_tokens_to_ids(t) for t in ("yes", "no"))
    model = AutoModelForCausalLM.from_pretrained(rankers[name][1]).eval()
    for k, doc in enumerate(docs):
        ids = tok(prefix + doc + prompt.suffix)["input_ids"]
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        want = torch.sigmoid(logits[yes] - logits[no]).item()
        assert got[k] == pytest.approx(want, abs=TOL)


def test_an_adapter_not_held_loads_on_first_use_in_place_of_the_least_recently_used(
        service, http):
    """Two slots, three adapters asked for in turn: each request finds its adapter unloaded
    (the least recently used is the one it needs next) and loads it in place of the one used
    longest ago; the scorer's metrics count each load and unload by model."""

    def counts() -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for name, labels, value in scrape(service.metrics_url()):
            if name in ("ray_ranker_adapter_loads_total", "ray_ranker_adapter_unloads_total"):
                key = (name.split("_")[3], labels["model"])
                out[key] = out.get(key, 0.0) + value
        return out

    first = {name: score(http, name) for name in ("ranker-a", "ranker-b")}  # now held
    reads = [counts()]

    def settled() -> bool:
        """Every load and unload so far published: each load took a full slot, so there are
        as many unloads, and nothing moves for a few publishing intervals."""
        time.sleep(2)
        reads.append(counts())
        now, loads = reads[-1], [v for (kind, _), v in reads[-1].items() if kind == "loads"]
        return (len(now) == 6 and now == reads[-2]
                and sum(loads) == sum(now.values()) - sum(loads))

    wait_until(settled, 60, "the adapter loads so far counted", service)
    before = reads[-1]
    again = {name: score(http, name) for name in ("ranker-c", "ranker-a", "ranker-b")}
    for name in first:  # loaded again, the same scores
        assert ([math.log(p) for row in again[name] for p in row]
                == pytest.approx([math.log(p) for row in first[name] for p in row], abs=1e-5))
    want = {(kind, name): 1 for kind in ("loads", "unloads") for name in ADAPTERS}
    wait_for_growth(counts, before, want, "loads and unloads counted by model", service)


def test_requests_of_several_adapters_at_once_score_as_each_alone(http):
    names = [None, *ADAPTERS]
    items = [[f"{word} number {k}" for k in range(4)] for word in ("red", "blue", "green")]
    alone = {(n, i): score(http, n, items=it) for n in names for i, it in enumerate(items)}
    with ThreadPoolExecutor(12) as pool:
        together = [(key, pool.submit(score, http, key[0], QUERY, items[key[1]]))
                    for _ in range(3) for key in alone]
    for key, future in together:
        got = [math.log(p) for row in future.result() for p in row]
        want = [math.log(p) for row in alone[key] for p in row]
        assert got == pytest.approx(want, abs=1e-5), key


def test_a_long_query_is_cached_apart_for_an_adapter_and_the_model(service, http, rankers,
                                                                     small_model):
    """The same long query under ranker-a and the model, twice each: two misses, then two
    hits, each hit scoring what its miss did, and ranker-a's what HF gives on its merged
    weights (a hit of the model's K/V would give the model's own scores)."""

    def lookups() -> dict[str, float]:
        out: dict[str, float] = {}
        for name, labels, value in scrape(service.metrics_url()):
            if name == "ray_ranker_prefix_cache_lookups_total":
                out[labels["result"]] = out.get(labels["result"], 0.0) + value
        return out

    query = " ".join(f"Fact {k}: the sky is blue." for k in range(20))  # over 64 tokens
    before = lookups()
    first = {name: score(http, name, query) for name in ("ranker-a", None)}
    again = {name: score(http, name, query) for name in ("ranker-a", None)}
    wait_for_growth(lookups, before, {"miss": 2, "hit": 2, "partial": 0, "bypass": 0},
                    "two misses, then two hits", service)
    for name, got in again.items():
        assert ([math.log(p) for row in got for p in row]
                == pytest.approx([math.log(p) for row in first[name] for p in row], abs=1e-5))
    want = hf_logprobs(rankers["ranker-a"][1], small_model, [(query, item) for item in ITEMS])
    for row, ref in zip(again["ranker-a"], want, strict=True):
        assert [math.log(p) for p in row] == pytest.approx(ref, abs=TOL)


def test_an_unknown_model_is_a_404_naming_it(http):
    for route, body in (("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": LABELS}),
                        ("/v1/rerank", {"query": "q", "documents": ["a"]})):
        r = http.post(route, content=json.dumps(body | {"model": "ranker-z"}))
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["param"] == "model" and "ranker-z" in error["message"]
