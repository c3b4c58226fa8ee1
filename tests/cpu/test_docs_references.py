"""The docs, and the code's comments, name code that exists. Written in backticks in README.md
and docs/*.md:
- `path/to/file.py` is a file, and `path/to/file.py::Name.attr` and `package.module(.name)` of
  this repository's packages resolve to a module-level name in it (a class's attribute or
  method where the name continues);
- `Class.name`, where this repository defines a class of that name, is defined in one of them;
- `module.name`, where `module` is the file name of one of its modules and the whole is no
  configuration key (`engine.deterministic`), is defined in one of them.
In the comments and strings of the code (no backticks there) `path/to/file.py(::Name)` and
`Class.name` of a class defined here are checked the same way.
Read from the source with `ast`: nothing is imported, so modules that need a GPU are checked
too (only the configuration schema is imported, for its keys)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("serve_app", "gpu_worker", "ranker_app", "ranker_contract", "ranker_batch",
            "tools", "loadtest")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FILE_REF = re.compile(r"`([\w/]+\.py)::([\w.]+)`")
DOTTED_REF = re.compile(rf"`((?:{'|'.join(PACKAGES)})(?:\.\w+)+)`")
PATH_REF = re.compile(rf"`((?:{'|'.join(PACKAGES)}|tests|scripts)/[\w/]+\.py)`")
METHOD_REF = re.compile(r"`([A-Z]\w+)\.(\w+)`")
FILE_SUFFIXES = {"py", "json", "parquet", "yaml", "md", "txt"}  # `config.json`: a file
MODULE_REF = re.compile(r"`([a-z]\w*)\.([a-z_]\w*)(?:\(\))?`")
# (this file aside: its self-check names code that is gone on purpose)
CODE = [path for package in (*PACKAGES, "tests") for path in sorted((REPO / package).rglob("*.py"))
        if path != Path(__file__).resolve()]
CODE_PATH_REF = re.compile(rf"\b((?:{'|'.join(PACKAGES)}|tests|scripts)/[\w/]+\.py)"
                           r"(?:::(\w+(?:\.\w+)*))?")
CODE_METHOD_REF = re.compile(r"\b([A-Z]\w+)\.(?!__)([a-z_]\w*)\b")  # Python's dunders aside
# the tokens of comments and strings (an f-string's text is FSTRING_MIDDLE from Python 3.12)
PROSE = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


@cache
def defined(path: Path) -> dict[str, set[str]]:
    """Module-level names of a file, and for each class the names defined in its body (methods,
    attributes): {"": module names, "Class": its names}."""
    tree = ast.parse(path.read_text())
    names: dict[str, set[str]] = {"": set()}

    def bound(node: ast.stmt) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    bases = {}
    for node in tree.body:
        names[""].update(bound(node))
        if isinstance(node, ast.ClassDef):
            names[node.name] = {n for child in node.body for n in bound(child)}
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    for _ in bases:  # a class has what its bases in the same file define
        for name, own_bases in bases.items():
            names[name].update(*(names.get(b, ()) for b in own_bases))
    return names


def resolves(path: Path, chain: list[str]) -> bool:
    if not chain:
        return True
    names = defined(path)
    if chain[0] not in names[""]:
        return False
    return len(chain) == 1 or (chain[0] in names and chain[1] in names[chain[0]])


@cache
def references() -> list[tuple[str, Path | None, list[str]]]:
    """(as written, its file or None, the names after the module) for every reference."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FILE_REF.finditer(text):
            found.append((m[0], REPO / m[1], m[2].split(".")))
        for m in DOTTED_REF.finditer(text):
            parts = m[1].split(".")
            # the longest prefix that is a module (a file, or a package's __init__.py); the
            # rest are names in it (none: the reference is the module itself)
            for k in range(len(parts), 0, -1):
                path = REPO.joinpath(*parts[:k]).with_suffix(".py")
                if not path.is_file():
                    path = REPO.joinpath(*parts[:k], "__init__.py")
                if path.is_file():
                    found.append((m[0], path, parts[k:]))
                    break
            else:
                found.append((m[0], None, parts))
    return found


@cache
def classes() -> dict[str, list[Path]]:
    """Each class this repository's packages define: the files that define one of that name."""
    found: dict[str, list[Path]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name in defined(path):
                if name:
                    found.setdefault(name, []).append(path)
    return found


@cache
def modules() -> dict[str, list[Path]]:
    """Each module file name of this repository's packages (without .py): its files."""
    found: dict[str, list[Path]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found.setdefault(path.stem, []).append(path)
    return found


@cache
def config_keys() -> set[str]:
    """Every key of the application's configuration, dotted from the top (`engine.deterministic`)
    and from each section down (`prefix_cache.tokens`), and the keys that went away."""
    from pydantic import BaseModel

    from ranker_contract import config

    keys: set[str] = set()

    def walk(model: type[BaseModel], path: list[str]) -> None:
        for name, field in model.model_fields.items():
            keys.update(".".join(path[k:] + [name]) for k in range(len(path) + 1))
            kind = field.annotation
            for inner in (kind, *getattr(kind, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    walk(inner, path + [name])

    walk(config.AppConfig, [])
    keys.update(config.REMOVED, (f"engine.{k}" for k in config.REMOVED_ENGINE_KEYS))
    return keys


def unresolved_module_names(text: str) -> list[str]:
    """The `module.name` references of `text`, of a module file name here and no configuration
    key, whose name none of those modules defines."""
    bad = []
    for m in MODULE_REF.finditer(text):
        if (m[1] in modules() and m[2] not in FILE_SUFFIXES
                and f"{m[1]}.{m[2]}" not in config_keys()
                and not any(resolves(path, [m[2]]) for path in modules()[m[1]])):
            bad.append(m[0])
    return bad


@cache
def paths_and_methods() -> list[tuple[str, Path | None, list[str]]]:
    """References by file path alone, and `Class.name` of a class defined here."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        found += [(m[0], REPO / m[1], []) for m in PATH_REF.finditer(text)]
        for m in METHOD_REF.finditer(text):
            for path in classes().get(m[1], []):
                if resolves(path, [m[1], m[2]]):
                    found.append((m[0], path, [m[1], m[2]]))
                    break
            else:
                if m[1] in classes():
                    found.append((m[0], classes()[m[1]][0], [m[1], m[2]]))
    return found


def test_the_docs_name_code_at_all():
    # the patterns still find what the docs write
    assert len(references()) >= 10 and len(paths_and_methods()) >= 50


@pytest.mark.parametrize(("written", "path", "chain"), references(),
                         ids=[r[0] for r in references()])
def test_each_named_function_or_class_exists(written, path, chain):
    assert path is not None and path.is_file(), f"{written}: no such module"
    assert resolves(path, chain), f"{written}: {'.'.join(chain)} is not defined in {path.name}"


@pytest.mark.parametrize(("written", "path", "chain"), paths_and_methods(),
                         ids=[r[0] for r in paths_and_methods()])
def test_each_named_file_and_method_exists(written, path, chain):
    assert path.is_file(), f"{written}: no such file"
    assert resolves(path, chain), f"{written}: not defined in {path.relative_to(REPO)}"


def test_each_named_module_function_exists():
    for doc in DOCS:
        assert not unresolved_module_names(doc.read_text()), doc.name


def test_a_module_function_that_is_gone_is_found():
    text = ("`validate.parse_body` (renamed), `startup.measure_budget`, `engine.deterministic` "
            "(a key), `prefix_cache.page_tokens` (a key under engine), `ops.py` (a file), "
            "`engine.no_such_key`")
    assert unresolved_module_names(text) == ["`validate.parse_body`", "`engine.no_such_key`"]


def unresolved_in_code(source: str) -> list[str]:
    """The references in the comments and strings of `source` that name no code here."""
    bad = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in PROSE:
            continue
        for m in CODE_PATH_REF.finditer(token.string):
            path = REPO / m[1]
            if not path.is_file() or (m[2] and not resolves(path, m[2].split("."))):
                bad.append(f"line {token.start[0]}: {m[0]}")
        for m in CODE_METHOD_REF.finditer(token.string):
            if m[1] in classes() and not any(resolves(p, [m[1], m[2]])
                                             for p in classes()[m[1]]):
                bad.append(f"line {token.start[0]}: {m[0]}")
    return bad


@pytest.mark.parametrize("path", CODE, ids=[str(p.relative_to(REPO)) for p in CODE])
def test_the_code_comments_name_code_that_exists(path):
    assert not unresolved_in_code(path.read_text())


def test_a_comment_naming_code_that_is_gone_is_found():
    source = ('x = 1  # budget from Engine.measure_budget; gpu_worker/forward/startup.py::warm_up\n'
              '"""LoraLinear.put (inherited), ScoreJob.__module__, serve_app/gone.py, '
              'tools/stats.py::aggregate."""\n')
    assert unresolved_in_code(source) == ["line 1: Engine.measure_budget",
                                          "line 2: serve_app/gone.py"]
