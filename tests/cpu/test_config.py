"""Config files and builder args are checked strictly; the ingress never imports torch."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gpu_worker.model_config import ModelFolderError
from serve_app.app import AppArgs, build_app
from serve_app.check_config import check_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_are_valid(path):
    check_config(path)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["applications"][0]["deployments"][1].update(max_concurrent_queries=5),
        lambda c: c["applications"][0]["args"].update(max_batch_token=5),
        lambda c: c["applications"][0]["deployments"][1]["autoscaling_config"].update(
            target_num_ongoing_requests_per_replica=3),
        lambda c: c["applications"][0]["deployments"][0].update(name="Ingress"),
        lambda c: c.update(http_option={}),
    ],
    ids=["old deployment key", "args typo", "old autoscaling key", "unknown deployment",
         "top-level typo"],
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
        AppArgs.model_validate({"model_pth": "x"})
    with pytest.raises(ValidationError):
        AppArgs(max_seq_tokens=9000, max_batch_tokens=8192)


def test_missing_model_folder_names_the_prepare_command(tmp_path):
    with pytest.raises(ModelFolderError, match="scripts/prepare_model.py"):
        build_app(AppArgs(model_path=str(tmp_path / "nowhere")))


def test_ingress_modules_do_not_import_torch():
    code = ("import sys, serve_app.ingress, serve_app.app, serve_app.scoring; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
