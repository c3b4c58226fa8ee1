"""The ingress's tokenizer: the ids transformers gives for the same tokenizer files, and other
threads of the replica keep running while it tokenizes."""

from __future__ import annotations

import threading
import time

from tokenizers import Tokenizer
from transformers import AutoTokenizer

from serve_app.tokenizer import TextTokenizer
from tests.cpu.conftest import DEFAULT_MODEL

TEXTS = [
    "Is the sky blue?",
    " leading space, trailing space ",
    "<|im_start|>" * 7,  # a special token, repeated (SGLang's bench text)
    "naïve café – 東京 🙂 tab\tand\nnewline",
    "",
    "word " * 3000,  # long
]


def test_query_and_item_ids_equal_transformers():
    ours = TextTokenizer(DEFAULT_MODEL)
    ref = AutoTokenizer.from_pretrained(DEFAULT_MODEL, local_files_only=True)
    for text in TEXTS:
        assert ours.encode_query(text) == ref(text)["input_ids"], text[:40]
    assert ours.encode_items(TEXTS) == [ref(t, add_special_tokens=False)["input_ids"]
                                        for t in TEXTS]


def _ticks_while(tokenize) -> int:
    """Sleeps of 1 ms the main thread completes in 1.5 s while another thread tokenizes."""
    done = threading.Event()

    def tokenize_until_told() -> None:
        while not done.is_set():
            tokenize()

    worker = threading.Thread(target=tokenize_until_told)
    worker.start()
    try:
        ticks, deadline = 0, time.monotonic() + 1.5
        while time.monotonic() < deadline:
            time.sleep(0.001)  # gives the GIL away and must get it back to count
            ticks += 1
    finally:
        done.set()
        worker.join()
    return ticks


def test_tokenizing_lets_other_python_threads_run():
    # The ingress tokenizes in a worker thread; a tokenizer call that held the GIL would stall
    # every other request of the replica for the whole text. Compared with the library's
    # `encode`, which holds it, on the same machine at the same moment: a ratio, not a time.
    tok = TextTokenizer(DEFAULT_MODEL)
    raw = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    text = "word " * 100_000
    holding = _ticks_while(lambda: raw.encode(text))
    query = _ticks_while(lambda: tok.encode_query(text))
    items = _ticks_while(lambda: tok.encode_items([text]))
    assert min(query, items) > 3 * max(holding, 1), (query, items, holding)
