"""Tokenization in the ingress with the `tokenizers` library (Rust, batched, no torch)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from ranker_contract.model_config import ModelFolderError


class TextTokenizer:
    """The query gets the tokenizer's special tokens, items none.

    NOTE: tokenizing query and items separately can differ from tokenizing the joined string
    (a merge across the boundary); token-id inputs avoid the question.
    """

    def __init__(self, folder: str | Path) -> None:
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise ModelFolderError(f"no tokenizer.json in {folder}: a fast (tokenizers) tokenizer "
                                   "file is needed")
        self._tok = Tokenizer.from_file(str(path))
        # A tokenizer.json may carry truncation or padding settings: we never truncate silently.
        self._tok.no_truncation()
        self._tok.no_padding()

    # NOTE: the batch calls release the GIL (`encode` holds it) and `_fast` skips the character
    # offsets nobody reads: less time per request, and other requests run meanwhile.
    def encode_query(self, text: str) -> list[int]:
        return self._tok.encode_batch_fast([text], add_special_tokens=True)[0].ids

    def encode_items(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_items_with_offsets(self, texts: list[str]
                                  ) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """As encode_items, with each token's characters of its text: (start, end)."""
        return [(e.ids, e.offsets)
                for e in self._tok.encode_batch(texts, add_special_tokens=False)]
