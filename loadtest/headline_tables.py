"""The README's and BENCHMARKS' headline tables, written from the latest headline run
(docs/results/headline/headline.json, loadtest/headline.py): one commit, one machine, no figure
from elsewhere.

  python -m loadtest.headline_tables          # rewrite both tables from the JSON
  python -m loadtest.headline_tables --check  # exit 1 where a table differs from the JSON

Each table sits between two marker lines, `<!-- headline:NAME:start -->` and
`<!-- headline:NAME:end -->`; tests/cpu/test_headline_tables.py fails when one is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loadtest.headline import FIGURES, RESULT
from tools import REPO_ROOT, doc_blocks

# figure -> (what it is, its unit); in this order in both tables
LABELS = {
    "engine_bf16_items_per_s": ("engine offline, bf16 (bench shape: 120-token query + 10 items "
                                "× 180 tokens)", "items/s"),
    "engine_fp8_items_per_s": ("engine offline, FP8", "items/s"),
    "ceiling_items_per_s": ("compute ceiling of the bench shape, measured in the run", "items/s"),
    "lora_1_adapter_ratio": ("LoRA: 1 adapter on every request ÷ the base engine", "ratio"),
    "lora_16_mixed_ratio": ("LoRA: 16 adapters mixed ÷ the base engine", "ratio"),
    "lora_lone_delta_ms": ("LoRA: a lone request on an idle service, 10 items, with an adapter "
                           "− without (p50)", "ms"),
    "http_text_bf16_items_per_s": ("HTTP, text, bf16: highest rate with P99 ≤ 500 ms and 0 "
                                   "failures", "items/s"),
    "http_text_fp8_items_per_s": ("HTTP, text, FP8: the same", "items/s"),
    "first_refusal_share_bf16": ("first 503, as a share of the engine's rate, bf16", "share"),
    "first_refusal_share_fp8": ("first 503, as a share of the engine's rate, FP8", "share"),
    "sporadic_lone_1item_p50_ms": ("a lone request on an idle service, 1 item: p50", "ms"),
    "sporadic_lone_1item_p99_ms": ("the same: p99", "ms"),
    "sporadic_lone_10item_p50_ms": ("a lone request on an idle service, 10 items: p50", "ms"),
    "sporadic_lone_10item_p99_ms": ("the same: p99", "ms"),
    "p99_at_half_load_ms": ("P99 at half of the HTTP capacity (bench shape)", "ms"),
    "load_control_idle_cost_ms": ("load control's cost to a lone request (on vs off)", "ms"),
    "goodput_1.2x_ratio": ("items/s answered at 1.2× the HTTP capacity ÷ at 1×", "ratio"),
    "goodput_1.5x_ratio": ("the same at 1.5×", "ratio"),
    "goodput_3x_ratio": ("the same at 3×", "ratio"),
    "long_10000x64_s": ("rerank of 10,000 documents × 64 words", "s"),
    "long_100x8000_s": ("rerank of 100 documents × 8,000 words", "s"),
    "prefix_profile_ratio": ("prefix cache on ÷ off, profile workload", "ratio"),
    "service_start_s": ("service start to every application healthy", "s"),
    "deterministic_bf16_ratio": ("engine, deterministic scores (shipped) ÷ off, bf16", "ratio"),
    "deterministic_fp8_ratio": ("the same, FP8", "ratio"),
    "deterministic_lone_delta_ms": ("engine, lone 1-item request: deterministic − off", "ms"),
    "feed_engine_items_per_s": ("engine offline, feed shape (300-token query + 100 items × 10 "
                                "tokens), bf16", "items/s"),
    "feed_http_items_per_s": ("HTTP, text, the feed shape: highest rate with P99 ≤ 500 ms and "
                              "0 failures", "items/s"),
    "feed_deterministic_ratio": ("engine, feed shape: deterministic scores (shipped) ÷ off",
                                 "ratio"),
    "prefix_reuse_ratio": ("HTTP, text, long queries with reuse (2,000 + 20 × 50 words, each "
                           "query 4 times): prefix cache on ÷ off", "ratio"),
    "engine_lone_ms": ("engine, a lone 1-item request, launch to scores", "ms"),
    "fp8_lone_delta_ms": ("a lone 1-item request on an idle service: FP8 − bf16 (p50)", "ms"),
    "p99_answered_1.2x_ms": ("P99 of the requests answered at 1.2× the HTTP capacity", "ms"),
    "p99_answered_1.5x_ms": ("the same at 1.5×", "ms"),
    "p99_answered_3x_ms": ("the same at 3×", "ms"),
}
TARGETS = {"readme": REPO_ROOT / "README.md", "benchmarks": REPO_ROOT / "docs" / "BENCHMARKS.md"}
NOT_MEASURED = "not measured"


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return NOT_MEASURED
    if unit == "items/s":
        return f"{value:,.0f} items/s"
    if unit in ("ms", "s"):
        return f"{value:.1f} {unit}"
    return f"{value:.2f}"


def _source(doc: dict, json_link: str) -> str:
    return (f"{doc['gpu']}, commit {doc['commit']}, {doc['measured_at'][:10]}: "
            f"`{doc['command']}` ([JSON]({json_link}))")


def readme_table(doc: dict) -> str:
    figures = doc["figures"]
    rows = [f"| {label} | {fmt(figures.get(key), unit)} |" for key, (label, unit) in
            LABELS.items()]
    return "\n".join([f"Measured on {_source(doc, 'docs/results/headline/headline.json')}.", "",
                      "| figure | value |", "| --- | --- |", *rows])


def benchmarks_table(doc: dict) -> str:
    """Every figure of the run at its commit, beside each baseline's and the change."""
    baselines = ([(doc["baseline"], doc["baseline_figures"], doc["diff"])] if doc["baseline"]
                 else []) + [(b["commit"], b["figures"], b["diff"])
                             for b in doc.get("more_baselines", [])]
    head = ["figure", doc["commit"]]
    for commit, _, _ in baselines:
        head += [commit, "change"]
    lines = [f"Measured on {_source(doc, 'results/headline/headline.json')}.", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, (label, unit) in LABELS.items():
        cells = [label, fmt(doc["figures"].get(key), unit)]
        for _, figures, diff in baselines:
            row = next((r for r in diff or [] if r["figure"] == key), None)
            change = "" if row is None else f"{row['change']:+.1%}" + (
                " **regression**" if row["regression"] else "")
            cells += [fmt(figures.get(key), unit), change]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


RENDER = {"readme": readme_table, "benchmarks": benchmarks_table}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- headline:{name}:start -->", f"<!-- headline:{name}:end -->"


def block(text: str, name: str) -> str:
    """What stands between the markers of `name` (ValueError where they are missing)."""
    return doc_blocks.block(text, markers(name))


def with_block(text: str, name: str, body: str) -> str:
    return doc_blocks.with_block(text, markers(name), body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 where a table is stale")
    p.add_argument("--json", type=Path, default=RESULT)
    args = p.parse_args(argv)
    doc = json.loads(args.json.read_text())
    missing = set(FIGURES) - set(doc["figures"])
    if missing:
        sys.exit(f"{args.json}: figures missing: {sorted(missing)}")
    stale = []
    for name, path in TARGETS.items():
        text, body = path.read_text(), RENDER[name](doc)
        if block(text, name) != body:
            stale.append(str(path.relative_to(REPO_ROOT)))
            if not args.check:
                path.write_text(with_block(text, name, body))
    if args.check and stale:
        print(f"stale headline tables: {stale}; run python -m loadtest.headline_tables")
        return 1
    print(("rewrote " + ", ".join(stale)) if stale and not args.check else "tables up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
