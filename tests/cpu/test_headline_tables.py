"""The headline run's tooling without a GPU: the README's and BENCHMARKS' tables against the
committed JSON (loadtest/headline_tables.py), the A/B's regression rule and the one Serve config
that serves every tree (loadtest/headline.py)."""

import json

import pytest

from loadtest import headline, headline_tables
from loadtest.headline import App, Tree, combined_config, diff_rows


def test_the_tables_in_the_docs_are_the_latest_headline_json():
    doc = json.loads(headline.RESULT.read_text())
    assert set(headline.FIGURES) <= set(doc["figures"])  # every key, numbers or null
    assert {"gpu", "commit", "command", "baseline", "figures"} <= set(doc)
    for name, path in headline_tables.TARGETS.items():
        written = headline_tables.block(path.read_text(), name)
        assert written == headline_tables.RENDER[name](doc), (
            f"{path.name} is stale: python -m loadtest.headline_tables")


def test_a_figure_not_measured_says_so():
    doc = {"gpu": "H100", "commit": "abc1234", "measured_at": "2026-11-28T00:00:00Z",
           "command": "python -m loadtest.headline", "baseline": None,
           "figures": {"engine_bf16_items_per_s": 2694.6}}
    table = headline_tables.readme_table(doc)
    assert "| engine offline, bf16" in table and "2,695 items/s |" in table
    assert "| a lone request on an idle service, 1 item: p50 | not measured |" in table


def test_a_block_needs_both_markers_in_order():
    start, end = headline_tables.markers("readme")
    text = f"intro\n{start}\nold\n{end}\nrest\n"
    new = headline_tables.with_block(text, "readme", "new")
    assert new == f"intro\n{start}\nnew\n{end}\nrest\n"
    with pytest.raises(ValueError):
        headline_tables.block(f"{end}\n{start}\n", "readme")
    with pytest.raises(ValueError):
        headline_tables.block("no markers", "readme")


def test_the_regression_rule():
    new = {"engine_bf16_items_per_s": 970.0, "http_text_bf16_items_per_s": 980.0,
           "sporadic_lone_1item_p50_ms": 11.5, "sporadic_lone_10item_p50_ms": 2.0,
           "p99_at_half_load_ms": 120.0, "ceiling_items_per_s": 500.0}
    old = {"engine_bf16_items_per_s": 1000.0, "http_text_bf16_items_per_s": 1000.0,
           "sporadic_lone_1item_p50_ms": 10.0, "sporadic_lone_10item_p50_ms": 1.5,
           "p99_at_half_load_ms": 110.0, "ceiling_items_per_s": 1000.0}
    flagged = {r["figure"]: r["regression"] for r in diff_rows(new, old)}
    assert flagged == {
        "engine_bf16_items_per_s": True,  # -3%
        "http_text_bf16_items_per_s": False,  # -2%
        "sporadic_lone_1item_p50_ms": True,  # +1.5 ms and +15%
        "sporadic_lone_10item_p50_ms": False,  # +33% but only +0.5 ms
        "p99_at_half_load_ms": False,  # +10 ms but only +9%
        "ceiling_items_per_s": False,  # the machine's, never flagged
    }


def test_every_tree_is_served_from_its_own_code_under_its_own_prefix(tmp_path):
    other = tmp_path / "base"
    (other / "configs").mkdir(parents=True)
    (other / headline.CONFIG).write_text((headline.REPO_ROOT / headline.CONFIG).read_text())
    apps = [App(Tree("head", headline.REPO_ROOT, "a"), "bf16"),
            App(Tree("base", other, "b"), "bf16"), App(Tree("head", headline.REPO_ROOT, "a"),
                                                       "fp8")]
    config = combined_config(apps, port=18000)
    assert config["http_options"]["port"] == 18000
    entries = {e["name"]: e for e in config["applications"]}
    assert set(entries) == {"head", "base", "head-fp8"}
    assert entries["base"]["route_prefix"] == "/base"
    assert entries["base"]["runtime_env"]["working_dir"] == f"local://{other}"
    assert entries["head"]["runtime_env"]["working_dir"] == f"local://{headline.REPO_ROOT}"
    assert entries["head-fp8"]["args"]["engine"]["precision"] == "fp8"
    assert entries["head"]["args"]["model_path"] == str(headline.MODEL)
    for entry in entries.values():
        worker = next(d for d in entry["deployments"] if d["name"] == "ScoreWorker")
        assert worker["ray_actor_options"]["num_gpus"] == pytest.approx(1 / 3)  # one GPU
        assert worker["num_replicas"] == 1 and "autoscaling_config" not in worker


def test_an_adapter_application_serves_one_adapter_beside_the_plain_one(tmp_path):
    tree = Tree("head", headline.REPO_ROOT, "a")
    apps = [App(tree, "bf16"), App(tree, "bf16", tmp_path / "adapter")]
    entries = {e["name"]: e for e in combined_config(apps, port=18000)["applications"]}
    assert set(entries) == {"head", "head-lora"}
    assert "adapters" not in entries["head"]["args"]
    assert entries["head-lora"]["args"]["adapters"] == [
        {"name": headline.ADAPTER, "path": str(tmp_path / "adapter")}]
    assert entries["head-lora"]["route_prefix"] == "/head-lora"


def test_a_lone_request_delta_needs_both_sides_measured():
    def side(p50, failed=0):
        return {"latency_ms": {"p50": p50}, "failed": failed}

    assert headline.delta_ms({"without": side(10.0), "with": side(11.25)}) == 1.25
    assert headline.delta_ms({"without": side(10.0), "with": side(9.5)}) == -0.5
    assert headline.delta_ms({"without": side(10.0), "with": side(11.0, 1)}) is None
    assert headline.delta_ms({"without": side(None), "with": side(11.0)}) is None


def test_an_application_without_load_control_refuses_nothing():
    tree = Tree("head", headline.REPO_ROOT, "a")
    apps = [App(tree, "bf16"), App(tree, "bf16", load_control=False)]
    entries = {e["name"]: e for e in combined_config(apps, port=18000)["applications"]}
    assert set(entries) == {"head", "head-nolc"}
    assert entries["head-nolc"]["args"]["scheduler"]["max_queue_wait_s"] == 0
    shipped = entries["head"]["args"]["scheduler"]["max_queue_wait_s"]
    assert shipped > 0  # the shipped config bounds the queue; the other app does not


def test_a_cache_application_serves_the_shipped_one_with_the_prefix_cache_on():
    tree = Tree("head", headline.REPO_ROOT, "a")
    apps = [App(tree, "bf16"), App(tree, "bf16", prefix_cache=True)]
    entries = {e["name"]: e for e in combined_config(apps, port=18000)["applications"]}
    assert set(entries) == {"head", "head-cache"}
    assert entries["head-cache"]["args"]["engine"]["prefix_cache"] == {
        "tokens": headline.PREFIX_CACHE_TOKENS}
    assert "prefix_cache" not in entries["head"]["args"]["engine"]  # off as shipped
    del entries["head-cache"]["args"]["engine"]["prefix_cache"]
    for name in ("name", "route_prefix"):
        del entries["head"][name], entries["head-cache"][name]
    assert entries["head"] == entries["head-cache"]  # nothing else differs


def _part(parts, figures, baseline_figures, commit="aaa1111", measured_at="2026-12-03T10:00:00Z"):
    return {"gpu": "NVIDIA H200", "commit": commit, "baseline": "bbb2222",
            "command": f"python -m loadtest.headline --parts {','.join(parts)}", "quick": True,
            "parts": parts, "complete": True, "measured_at": measured_at, "seconds": 300,
            "figures": dict.fromkeys(headline.FIGURES) | figures,
            "baseline_figures": dict.fromkeys(headline.FIGURES) | baseline_figures,
            "diff": [], "more_baselines": [],
            "details": {"head": {parts[0]: 1, "start": parts[0]}}}


def test_parts_of_one_run_merge_into_one_headline():
    bench = _part(["bench"], {"engine_bf16_items_per_s": 2700.0, "service_start_s": 100.0},
                  {"engine_bf16_items_per_s": 2800.0, "service_start_s": 101.0})
    feed = _part(["feed"], {"feed_engine_items_per_s": 16000.0, "service_start_s": 90.0},
                 {"feed_engine_items_per_s": 15000.0, "service_start_s": 91.0},
                 measured_at="2026-12-03T11:00:00Z")
    doc = headline.merge_parts([bench, feed])
    figures = doc["figures"]
    assert figures["engine_bf16_items_per_s"] == 2700.0
    assert figures["feed_engine_items_per_s"] == 16000.0
    assert figures["service_start_s"] == 100.0  # the first part's, where both measured it
    assert figures["feed_http_items_per_s"] is None and set(headline.FIGURES) <= set(figures)
    rows = {r["figure"]: r for r in doc["diff"]}
    assert rows["engine_bf16_items_per_s"]["regression"]  # 2,700 against 2,800: −3.6%
    assert not rows["feed_engine_items_per_s"]["regression"]  # +6.7%
    assert doc["measured_at"] == "2026-12-03T11:00:00Z" and doc["seconds"] == 600
    assert "--parts bench" in doc["command"] and "--parts feed" in doc["command"]
    assert [p["parts"] for p in doc["parts"]] == [["bench"], ["feed"]]
    assert doc["details"]["head"] == {"bench": 1, "feed": 1, "start": "bench"}
    # the tables read the merged JSON as any other
    assert "16,000 items/s |" in headline_tables.readme_table(doc)


def test_parts_of_different_commits_do_not_merge():
    with pytest.raises(ValueError, match="commit"):
        headline.merge_parts([_part(["bench"], {}, {}), _part(["feed"], {}, {}, commit="ccc3333")])
