"""A labelled rerank set from real text that ships with CPython: the help topics of `pydoc`
(`pydoc_data.topics.topics`, the Python Language Reference as plain text). For the fidelity
tool (tools/fidelity.py).

- Sections: every heading of a topic (a title line underlined with `*`, `=`, `-`, ...) starts
  a section; a section owns the passages under it and under its sub-headings.
- Passages: prose paragraphs (code, grammar, tables and doctests dropped), whitespace folded,
  short neighbours joined and long ones cut at sentence ends, so each has 20-120 words. A text
  that two topics share (typesseq-mutable repeats part of typesseq) makes them related; a
  section repeated in another topic (compound holds if, while, ...) is kept once.
- Queries: the section's title as a question ("How do I use the assert statement in
  Python?"), one of three phrasings. The title names what the passages explain without
  quoting a sentence of them, so a query never matches its passages by copied text.
- Requests: 1-3 passages of the section are relevant; the distractors are passages of
  unrelated topics (never of the query's own topic, whose other sections may answer it too).
  10-50 items (or a fixed count), shuffled. Rounds go through every section once, in a seeded
  order, before any section repeats with fresh passages and distractors: the first 170
  requests (CPython 3.11) have distinct queries, and there are as many requests as asked for.

The text is the running CPython's, so the set changes with the Python version (the results
record it). On 3.11: 170 sections, 927 distinct passages of 45 words on average.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pydoc_data.topics import topics as PYDOC_TOPICS

MIN_WORDS, MAX_WORDS = 20, 120
MIN_ITEMS, MAX_ITEMS = 10, 50
MAX_RELEVANT = 3
AVAILABLE = 1000  # requests the set promises (any number can be asked for; sections repeat)
QUESTIONS = ("How do I use {} in Python?", "What does the Python reference say about {}?",
             "Explain {} in Python.")
PYTHON_NAMES = {"None", "Ellipsis"}  # headings that start with a name, kept capitalized
_UNDERLINE = re.compile(r"([*=\-~^#])\1{2,}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


@dataclass(frozen=True, slots=True)
class Section:
    topic: str
    title: str
    passages: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LabelledRequest:
    query: str
    documents: list[str]
    relevant: list[int]  # indices into documents
    topic: str  # pydoc topic and section title, for reading results
    section: str


def _is_prose(paragraph: str) -> bool:
    lines = [line.strip() for line in paragraph.splitlines()]
    if any(line.startswith((">>>", "...", "+--", "|", "===")) or "::=" in line
           for line in lines):
        return False
    words = " ".join(lines).split()
    wordlike = sum(bool(re.fullmatch(r"[(\"']?[A-Za-z][a-z'-]*[.,;:)\"']*", w)) for w in words)
    return bool(words) and wordlike >= 0.75 * len(words) and words[-1][-1] in ".:"


def _chunks(paragraphs: list[str]) -> list[str]:
    """Prose paragraphs → passages of MIN_WORDS..MAX_WORDS words, in order: a paragraph is one
    passage, a short one joins the next, a long one is cut at sentence ends."""
    passages, current = [], []
    for paragraph in paragraphs:
        text = " ".join(re.sub(r"(?<=\w-)\n\s*", "", paragraph).split())  # "left-\nhand"
        for sentence in _SENTENCE_END.split(text):
            if current and len(" ".join(current + [sentence]).split()) > MAX_WORDS:
                passages.append(" ".join(current))
                current = []
            current.append(sentence)
        if len(" ".join(current).split()) >= MIN_WORDS:
            passages.append(" ".join(current))
            current = []
    passages.append(" ".join(current))
    return [p for p in passages if MIN_WORDS <= len(p.split()) <= MAX_WORDS]


def _title(line: str, parent: str | None) -> str:
    """A heading as a query's subject; a one-word sub-heading ("Overview", "Guards") gets its
    parent's title for context."""
    title = re.sub(r"\*(\w[^*]*)\*", r"\1", line.replace('"', "")).strip()  # *__slots__*
    if parent is not None and " " not in title:
        title = f"{title} in {_title(parent, None)}"
    first = title.split()[0]
    if re.fullmatch(r"[A-Z][a-z]+", first) and first not in PYTHON_NAMES:
        title = title[0].lower() + title[1:]  # "Explain format examples in Python."
    return title


def _headings(lines: list[str]) -> list[tuple[int, int]]:
    """(line index, level) of every title line underlined with one repeated character."""
    heads = []
    for i in range(len(lines) - 1):
        under = _UNDERLINE.fullmatch(lines[i + 1].strip())
        if lines[i].strip() and under and len(lines[i + 1].strip()) >= len(lines[i].strip()):
            heads.append((i, "*=-~^#".index(under[1])))
    return heads


def topic_sections(topic: str, text: str) -> list[Section]:
    """The sections of one topic, each with the passages under it (sub-sections included)."""
    lines = text.splitlines()
    heads = _headings(lines)
    heading_lines = {i + d for i, _ in heads for d in (0, 1)}
    sections = []
    for n, (start, level) in enumerate(heads):
        end = next((i for i, lv in heads[n + 1:] if lv <= level), len(lines))
        body = "\n".join(lines[j] for j in range(start, end) if j not in heading_lines)
        paragraphs = [p for p in re.split(r"\n\s*\n", body) if _is_prose(p)]
        passages = tuple(_chunks(paragraphs))
        parent = next((lines[i] for i, lv in reversed(heads[:n]) if lv < level), None)
        if passages:
            sections.append(Section(topic, _title(lines[start], parent), passages))
    return sections


def all_sections() -> list[Section]:
    """Every topic's sections; a section repeated in another topic (compound holds if, while,
    ...) is kept once, under the first topic in name order."""
    unique: dict[tuple[str, tuple[str, ...]], Section] = {}
    for topic in sorted(PYDOC_TOPICS):
        for s in topic_sections(topic, PYDOC_TOPICS[topic]):
            unique.setdefault((s.title, s.passages), s)
    return list(unique.values())


def _related_topics(sections: list[Section]) -> dict[str, set[str]]:
    """topic → itself and every topic sharing a passage with it."""
    owners: dict[str, set[str]] = {}
    for s in sections:
        for p in s.passages:
            owners.setdefault(p, set()).add(s.topic)
    related: dict[str, set[str]] = {s.topic: {s.topic} for s in sections}
    for group in owners.values():
        for topic in group:
            related[topic] |= group
    return related


def _request(section: Section, pool: list[str], n_items: int,
             rng: random.Random) -> LabelledRequest:
    k = rng.randint(1, min(MAX_RELEVANT, len(section.passages)))
    relevant = rng.sample(section.passages, k)
    docs = [(p, True) for p in relevant] + [(p, False) for p in rng.sample(pool, n_items - k)]
    rng.shuffle(docs)
    query = rng.choice(QUESTIONS).format(section.title)
    return LabelledRequest(query, [d for d, _ in docs], [i for i, (_, r) in enumerate(docs) if r],
                           section.topic, section.title)


def labelled_requests(n: int, items: int | None = None, seed: int = 0) -> list[LabelledRequest]:
    """The first `n` requests of the set: `items` documents each (None: 10-50, seeded)."""
    if items is not None and not MAX_RELEVANT < items <= MAX_ITEMS:
        raise ValueError(f"items must be {MAX_RELEVANT + 1}..{MAX_ITEMS}, not {items}")
    rng = random.Random(seed)
    sections = all_sections()
    related = _related_topics(sections)
    pools = {topic: sorted({p for s in sections if s.topic not in related[topic]
                            for p in s.passages}) for topic in related}
    out: list[LabelledRequest] = []
    while len(out) < n:
        for section in rng.sample(sections, len(sections)):  # one round: every section once
            if len(out) == n:
                break
            n_items = items if items is not None else rng.randint(MIN_ITEMS, MAX_ITEMS)
            out.append(_request(section, pools[section.topic], n_items, rng))
    return out
