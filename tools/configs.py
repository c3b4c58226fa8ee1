"""The shipped Serve configs (configs/*.yaml), read the way Serve hands them to the service."""

from __future__ import annotations

import yaml

from ranker_contract.config import AppConfig
from tools import REPO_ROOT


def shipped_yaml(name: str) -> dict:
    """The whole YAML document of configs/NAME (to edit, e.g. loadtest/scale_config.py)."""
    return yaml.safe_load((REPO_ROOT / "configs" / name).read_text())


def shipped_app_config(name: str) -> AppConfig:
    """`applications[0].args` of configs/NAME, validated like the service's own settings."""
    return AppConfig.model_validate(shipped_yaml(name)["applications"][0]["args"])
