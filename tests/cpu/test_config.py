"""Config files and builder args are checked strictly; the packages keep their layers: the
ingress never imports torch, and neither side imports the other."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from ranker_app.app import build_app
from ranker_app.check_config import check_config
from ranker_contract.config import AppConfig, EngineConfig, Limits, SchedulerConfig
from ranker_contract.model_config import ModelFolderError

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_are_valid(path):
    check_config(path)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["applications"][0]["deployments"][1].update(max_concurrent_queries=5),
        lambda c: c["applications"][0]["args"].update(max_batch_tokens=5),
        lambda c: c["applications"][0]["args"]["scheduler"].update(max_batch_token=5),
        lambda c: c["applications"][0]["deployments"][1]["autoscaling_config"].update(
            target_num_ongoing_requests_per_replica=3),
        lambda c: c["applications"][0]["deployments"][0].update(name="Ingress"),
        lambda c: c.update(http_option={}),
    ],
    ids=["old deployment key", "args key at the wrong level", "args typo", "old autoscaling key",
         "unknown deployment", "top-level typo"],
)
def test_typos_that_serve_would_ignore_are_errors(tmp_path, mutate):
    config = yaml.safe_load((REPO / "configs" / "score.yaml").read_text())
    mutate(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError):
        check_config(path)


def test_builder_args_reject_unknown_keys_and_bad_limits():
    with pytest.raises(ValidationError):
        AppConfig.model_validate({"model_pth": "x"})
    with pytest.raises(ValidationError):
        AppConfig.model_validate({"engine": {"attention": "flash"}})
    with pytest.raises(ValidationError):
        AppConfig(limits=Limits(max_seq_tokens=9000),
                  scheduler=SchedulerConfig(max_batch_tokens=8192))
    with pytest.raises(ValidationError, match="needs device 'cuda'"):
        EngineConfig(ops="cuda")
    with pytest.raises(ValidationError, match="needs engine.device 'cuda'"):
        AppConfig(scheduler=SchedulerConfig(max_batch_tokens=0))
    with pytest.raises(ValidationError):  # frozen: settings never change after start
        AppConfig().limits.max_seq_tokens = 5


def test_missing_model_folder_names_the_prepare_command(tmp_path):
    with pytest.raises(ModelFolderError, match="scripts/prepare_model.py"):
        build_app(AppConfig(model_path=str(tmp_path / "nowhere")))


def test_ingress_modules_do_not_import_torch():
    code = ("import sys, serve_app.ingress, serve_app.scoring, ranker_app.app, "
            "ranker_app.check_config, ranker_contract.config, ranker_contract.packing; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# package -> the project packages it may import (besides itself)
LAYERS = {
    "ranker_contract": set(),
    "serve_app": {"ranker_contract"},
    "gpu_worker": {"ranker_contract"},
    "ranker_app": {"ranker_contract", "serve_app", "gpu_worker"},
}


def _project_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & LAYERS.keys()


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_packages_import_only_the_layers_below(package):
    files = sorted((REPO / package).glob("*.py"))
    assert files
    wrong = {f"{f.name} imports {name}" for f in files
             for name in _project_imports(f) - LAYERS[package] - {package}}
    assert not wrong


def test_rerank_settings_are_checked():
    from ranker_contract.config import RerankConfig, RerankPrompt

    assert AppConfig().rerank.resolved_prompt().yes_label == "yes"
    with pytest.raises(ValueError, match="rerank.prompt is required"):
        RerankConfig(template="custom")
    with pytest.raises(ValueError, match="only then"):
        RerankConfig(template="qwen3", prompt=AppConfig().rerank.resolved_prompt())
    with pytest.raises(ValueError, match=r"\{query\}"):
        RerankPrompt(prefix="no placeholder", suffix="", yes_label="y", no_label="n")
    with pytest.raises(ValueError, match=r"\{document\}"):
        RerankPrompt(prefix="{query}", document="doc", suffix="", yes_label="y", no_label="n")
    with pytest.raises(ValueError, match="differ"):
        RerankPrompt(prefix="{query}", suffix="", yes_label="y", no_label="y")
    with pytest.raises(ValueError, match="extra"):
        RerankConfig(templat="qwen3")
    custom = RerankConfig(template="qwen3", default_instruction="Find answers")
    assert custom.resolved_prompt().default_instruction == "Find answers"


@pytest.mark.parametrize("mode, scorers", [("fixed1", 1), ("fixed2", 2), ("fixed4", 4),
                                           ("auto", 2)])
def test_scaling_variants_run_the_shipped_ingress_per_scorer(mode, scorers, tmp_path):
    from loadtest.configs import shipped_yaml
    from loadtest.scale_config import variant

    shipped = shipped_yaml("score-gpu.yaml")
    ingress = next(d for d in shipped["applications"][0]["deployments"]
                   if d["name"] == "ScoreIngress")
    deployments = {d["name"]: d for d in variant(mode)["applications"][0]["deployments"]}
    assert deployments["ScoreIngress"]["num_replicas"] == scorers * ingress["num_replicas"]
    assert deployments["ScoreIngress"]["max_ongoing_requests"] == ingress["max_ongoing_requests"]
    worker = deployments["ScoreWorker"]
    if mode == "auto":
        assert worker["autoscaling_config"]["max_replicas"] == scorers
    else:
        assert worker["num_replicas"] == scorers and "autoscaling_config" not in worker
    path = tmp_path / f"score-gpu-{mode}.yaml"
    path.write_text(yaml.safe_dump(variant(mode), sort_keys=False))
    check_config(path)
