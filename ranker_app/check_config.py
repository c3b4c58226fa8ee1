"""Strict check of a Serve config file: `python -m ranker_app.check_config configs/score.yaml`.

Serve's schema silently ignores unknown keys (a typo like `max_concurrent_queries` runs with
the default) and keeps some sections as plain dicts until it deploys (`autoscaling_config`).
This validates the file with Serve's own schema classes (ray.serve.schema), rejects every key
that those classes do not declare (read from their `model_fields`, so the check follows the
installed Ray), then checks this project's part: the builder, its `args` (AppConfig), the
deployments it binds and the autoscaling policy (docs/ARCHITECTURE.md, "Settings"). Each
problem names its place in the file, e.g. `applications[0].deployments[1].bogus`.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError
from ray.runtime_env import RuntimeEnv
from ray.serve.schema import ServeDeploySchema

from ranker_app.autoscaling_policy import ScorerLoadPolicy
from ranker_contract.config import AppConfig

BUILDER = "ranker_app.app:build_app"
DEPLOYMENTS = ("ScoreIngress", "ScoreWorker")  # what BUILDER binds
POLICY = f"{ScorerLoadPolicy.__module__}:{ScorerLoadPolicy.__qualname__}"

Problems = dict[str, str]  # place in the file -> what is wrong there
Section = tuple[str, dict, type[BaseModel], bool]  # see _sections
TOP = "(the whole file)"


def check_config(path: str | Path) -> ServeDeploySchema:
    """The file as Serve reads it; raises ValueError naming every problem found."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a Serve config (a YAML mapping)")
    problems = _serve_problems(data)
    if not problems:  # the project's checks rely on the shapes Serve's schema has checked
        problems = _project_problems(data)
    if problems:
        lines = [f"  {where}: {what}" for where, what in problems.items()]
        raise ValueError("\n".join([f"{path}: {len(problems)} problem(s)", *lines]))
    return ServeDeploySchema.model_validate(data)


def _serve_problems(data: dict) -> Problems:
    """What Serve's schema classes reject, and what they let through: keys they do not declare,
    sections Serve keeps as plain dicts until it deploys, and runtime_env keys."""
    problems: Problems = {}
    for where, section, model, loose in _sections(data, ServeDeploySchema, ""):
        _add(problems, _unknown_keys(section, model, where))
        if loose:
            _add(problems, _validation_problems(model, section, where))
        env = section.get("runtime_env") if "runtime_env" in model.model_fields else None
        if isinstance(env, dict):
            _add(problems, _runtime_env_problems(env, _join(where, "runtime_env")))
    top = _validation_problems(ServeDeploySchema, data, "")
    if TOP not in top or not problems:  # a section that cannot be built is named above
        _add(problems, top)
    return problems


def _add(problems: Problems, more: Problems) -> None:
    # The first problem found at a place keeps its message: an unknown key is named as such,
    # not again as pydantic's "extra inputs are not permitted".
    for where, what in more.items():
        problems.setdefault(where, what)


def _sections(value, annotation, where: str, loose: bool = False) -> Iterator[Section]:
    """Every mapping in `value` that a Serve schema class describes, found by walking
    `annotation` (a field's type): (place, mapping, class, loose). Loose: the field's type is
    a union with a plain dict, so Serve keeps the mapping unchecked and builds the class only
    when it deploys (`autoscaling_config`)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        yield from _sections(value, args[0], where, loose)
    elif origin in (typing.Union, types.UnionType):
        plain_dict = any(arg is dict or typing.get_origin(arg) is dict for arg in args)
        for arg in args:
            yield from _sections(value, arg, where, plain_dict)
    elif origin is list and args and isinstance(value, list):
        for i, item in enumerate(value):
            yield from _sections(item, args[0], _join(where, i))
    elif _is_model(annotation) and isinstance(value, dict):
        yield where, value, annotation, loose
        for key, item in value.items():  # checked with this mapping when it is checked
            field = annotation.model_fields.get(key)
            if field is not None:
                yield from _sections(item, field.annotation, _join(where, key))


def _is_model(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _unknown_keys(section: dict, model: type[BaseModel], where: str) -> Problems:
    fields = model.model_fields
    known = set(fields) | {field.alias for field in fields.values() if field.alias}
    return {_join(where, key): f"unknown key: Serve's {model.__name__} has no such field "
            "(Serve would ignore it)" for key in section if key not in known}


def _runtime_env_problems(env: dict, where: str) -> Problems:
    # A plain dict in Serve's schema; Ray's RuntimeEnv knows its keys and checks their values.
    unknown = {_join(where, key): "unknown key: not a field of Ray's RuntimeEnv"
               for key in env if key not in RuntimeEnv.known_fields}
    if unknown:
        return unknown
    try:
        RuntimeEnv(**env)
    except (TypeError, ValueError) as exc:
        return {where: str(exc)}
    return {}


def _validation_problems(model: type[BaseModel], data, where: str) -> Problems:
    try:
        model.model_validate(data)
    except ValidationError as exc:
        problems: Problems = {}
        for error in exc.errors():
            place, what = _describe(error, data, where)
            _add(problems, {place: what})  # a union's members fail at one place: the first
        return problems
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        # Serve's AutoscalingConfig imports its policy function while it is built, and an
        # error there stops pydantic at the top level too.
        return {where or TOP: f"Serve's {model.__name__} cannot be built: "
                              f"{type(exc).__name__}: {exc}"}
    return {}


def _describe(error: dict, data, where: str) -> tuple[str, str]:
    """(place, message) of one pydantic error; the place follows `error["loc"]` as far as the
    file goes (pydantic adds the names of a union's members after it)."""
    value = data
    for part in error["loc"]:
        if isinstance(value, (dict, list)) and _holds(value, part):
            where, value = _join(where, part), value[part]
        else:
            if error["type"] == "missing":
                where = _join(where, part)
            break
    if error["type"] == "extra_forbidden":
        return where, "unknown key"
    if error["type"] == "missing" or isinstance(value, (dict, list)):
        return where, error["msg"]
    return where, f"{error['msg']} (got {value!r})"


def _holds(container: dict | list, part) -> bool:
    if isinstance(container, dict):
        return part in container
    return isinstance(part, int) and 0 <= part < len(container)


def _join(where: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{where}[{part}]"
    return f"{where}.{part}" if where else str(part)


def _project_problems(data: dict) -> Problems:
    """This project's part of a file that Serve's schema accepts."""
    problems: Problems = {}
    for i, app in enumerate(data["applications"]):
        where = f"applications[{i}]"
        if app["import_path"] != BUILDER:
            problems[f"{where}.import_path"] = (f"must be {BUILDER} (got "
                                                f"{app['import_path']!r})")
        problems |= _validation_problems(AppConfig, app.get("args", {}), f"{where}.args")
        for j, deployment in enumerate(app.get("deployments") or []):
            problems |= _deployment_problems(deployment, f"{where}.deployments[{j}]")
    return problems


def _deployment_problems(deployment: dict, where: str) -> Problems:
    problems: Problems = {}
    if deployment["name"] not in DEPLOYMENTS:
        problems[f"{where}.name"] = (f"{BUILDER} binds {' and '.join(DEPLOYMENTS)} (got "
                                     f"{deployment['name']!r})")
    policy = (deployment.get("autoscaling_config") or {}).get("policy")
    if policy is None:
        return problems
    where = f"{where}.autoscaling_config.policy"
    if policy.get("policy_function") != POLICY:
        problems[f"{where}.policy_function"] = (f"must be {POLICY} (got "
                                                f"{policy.get('policy_function')!r})")
        return problems
    try:  # a wrong or missing kwarg fails here, not on the controller later
        ScorerLoadPolicy(**policy.get("policy_kwargs", {}))
    except (TypeError, ValueError) as exc:
        problems[f"{where}.policy_kwargs"] = str(exc)
    return problems


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m ranker_app.check_config CONFIG.yaml ...", file=sys.stderr)
        return 2
    status = 0
    for path in argv:
        try:
            check_config(path)
            print(f"{path}: ok")
        except (ValueError, OSError) as exc:
            print(exc, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
