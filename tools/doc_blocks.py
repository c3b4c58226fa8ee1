"""Generated blocks of the docs: the text between a start and an end marker line, read and
replaced (loadtest/headline_tables.py, tools/cpu_table.py)."""

from __future__ import annotations


def block(text: str, markers: tuple[str, str]) -> str:
    """What stands between the two marker lines (ValueError where they are missing)."""
    start, end = markers
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"need one {start} line, then one {end} line")
    return text[text.index(start) + len(start):text.index(end)].strip("\n")


def with_block(text: str, markers: tuple[str, str], body: str) -> str:
    """`text` with `body` between the two marker lines."""
    start, end = markers
    block(text, markers)  # the markers are there
    return text[:text.index(start) + len(start)] + "\n" + body + "\n" + text[text.index(end):]
