"""The README's CPU table against the committed docs/results/cpu/cpu.json (tools/cpu_table.py),
and the table's rows from hand-made figures."""

import json

import pytest

from tools import cpu_table


def test_the_readme_table_is_the_latest_cpu_json():
    doc = json.loads(cpu_table.RESULT.read_text())
    assert set(cpu_table.FIGURES) <= set(doc["figures"])  # every key, numbers or null
    assert {"command", "cpu", "commit", "measured_at", "workload", "figures"} <= set(doc)
    assert {"model", "vendor", "flags", "cores"} <= set(doc["cpu"])
    written = cpu_table.block(cpu_table.README.read_text())
    assert written == cpu_table.readme_block(doc), (
        "README.md's CPU table is stale: python -m tools.cpu_table --tables-only")


def _doc(**figures) -> dict:
    return {"command": "python -m tools.cpu_table", "quick": False, "complete": True,
            "commit": "abc1234", "tree_dirty": False, "measured_at": "2026-12-01T10:00:00Z",
            "cpu": {"model": "AMD EPYC", "vendor": "AuthenticAMD", "cores": 2,
                    "flags": {"avx2": True, "avx512f": False, "amx_tile": False}},
            "figures": dict.fromkeys(cpu_table.FIGURES) | figures}


def test_rows_from_hand_made_figures():
    doc = _doc(lone_1_item_p50_s=0.774, lone_1_item_p99_s=1.049,
               capacity_10_item_rps=0.1667, capacity_items_per_s=1.667,
               **{"overload_0.75x_offered_rps": 0.125, "overload_0.75x_goodput_items_per_s": 1.25,
                  "overload_0.75x_p99_s": 7.91, "overload_0.75x_503_count": 0,
                  "overload_0.75x_other_failures": {},
                  "overload_5x_offered_rps": 0.8333, "overload_5x_goodput_items_per_s": 1.5,
                  "overload_5x_goodput_ratio": 0.9, "overload_5x_p99_s": 16.2,
                  "overload_5x_503_count": 12, "overload_5x_503_p99_s": 0.031,
                  "overload_5x_other_failures": {"408": 1}},
               expired_request_status=408, expired_request_s=2.71, after_expired_1_item_s=4.2,
               after_expired_1_item_status="ok", rerank_5000_words_s=20.34,
               rerank_5000_words_tokens=6113, serve_run_to_health_s=14.23)
    rows = dict(cpu_table.rows(doc))
    assert rows["a lone request on an idle service, 1 item"] == "p50 0.77 s, p99 1.05 s"
    assert rows["a lone request on an idle service, 10 items"] == "not measured"
    assert rows["capacity estimate (1×): 1 ÷ the lone 10-item p50"] == (
        "0.167 req/s (1.67 items/s)")
    assert rows["10-item requests, Poisson arrivals at 0.75× that (0.125 req/s)"] == (
        "1.25 items/s answered at P99 7.91 s; 0 × 503; no other failure")
    assert rows["10-item requests, Poisson arrivals at 5× that (0.833 req/s)"] == (
        "1.50 items/s answered (0.90 of 1×) at P99 16.2 s; 12 × 503 (p99 0.03 s); "
        "other failures: 1 408")
    assert rows["10-item requests, Poisson arrivals at 10× that"] == "not measured"
    assert rows["the next 1-item request after a 10,000-token one expired "
                "(`x-request-timeout-seconds: 3`: 408 after 2.71 s)"] == "4.20 s"
    assert rows["one `/v2/rerank` of a 5,000-word document (6,113 tokens)"] == "20.3 s"
    assert rows["`serve run configs/score.yaml` to `/health` answering 200"] == "14.2 s"


def test_the_block_names_the_machine_and_says_a_quick_run_is_one():
    doc = _doc()
    text = cpu_table.readme_block(doc)
    assert text.startswith("Its figures on AMD EPYC (AuthenticAMD; AVX2, no AVX-512F, no AMX), "
                           "2 cores, 2026-12-01, commit abc1234,")
    assert "quick run" not in text and "| default SmolLM2-135M on CPU, 2-core machine |" in text
    assert all(value == "not measured" for _, value in cpu_table.rows(doc))
    quick = cpu_table.readme_block(doc | {"quick": True, "tree_dirty": True})
    assert "commit abc1234 with uncommitted changes" in quick and "quick run" in quick


def test_cpu_info_reads_the_first_processor():
    info = cpu_table.cpu_info("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel "
                              "Xeon\nflags\t\t: fpu avx2 avx512f amx_tile\n\nprocessor\t: 1\n"
                              "model name\t: other\n")
    assert info["model"] == "Intel Xeon" and info["vendor"] == "GenuineIntel"
    assert info["flags"] == {"avx2": True, "avx512f": True, "amx_tile": True}
    assert cpu_table.cpu_info("")["flags"] == {"avx2": False, "avx512f": False,
                                               "amx_tile": False}


def test_a_block_needs_both_markers_in_order():
    start, end = cpu_table.MARKERS
    text = f"intro\n{start}\nold\n{end}\nrest\n"
    assert cpu_table.with_block(text, "new") == f"intro\n{start}\nnew\n{end}\nrest\n"
    with pytest.raises(ValueError):
        cpu_table.block(f"{end}\n{start}\n")
    with pytest.raises(ValueError):
        cpu_table.block("no markers")


def test_check_fails_on_a_stale_table_and_tables_only_mends_it(tmp_path):
    readme = tmp_path / "README.md"
    start, end = cpu_table.MARKERS
    readme.write_text(f"top\n{start}\nhand-edited\n{end}\nbottom\n")
    assert cpu_table.write_readme(_doc(), check=True, readme=readme) == 1
    assert "hand-edited" in readme.read_text()
    assert cpu_table.write_readme(_doc(), check=False, readme=readme) == 0
    assert cpu_table.block(readme.read_text()) == cpu_table.readme_block(_doc())
    assert cpu_table.write_readme(_doc(), check=True, readme=readme) == 0
