"""Config files and builder args are checked strictly; the packages keep their layers: the
ingress never imports torch, and neither side imports the other."""

import ast
import json
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
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


def _problems_of(tmp_path, mutate) -> str:
    """check_config's message for configs/score.yaml changed by `mutate`."""
    config = yaml.safe_load((REPO / "configs" / "score.yaml").read_text())
    mutate(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError) as caught:
        check_config(path)
    return str(caught.value)


def _app(config: dict) -> dict:
    return config["applications"][0]


@pytest.mark.parametrize(
    "mutate, place",
    [
        (lambda c: c.update(grpc_option={}), "grpc_option"),
        (lambda c: c["http_options"].update(hots="0.0.0.0"), "http_options.hots"),
        (lambda c: _app(c)["deployments"][1].update(bogus=1),
         "applications[0].deployments[1].bogus"),
        (lambda c: _app(c)["deployments"][0]["ray_actor_options"].update(num_cpu=1),
         "applications[0].deployments[0].ray_actor_options.num_cpu"),
        (lambda c: _app(c)["deployments"][1]["autoscaling_config"]["policy"].update(kwargs={}),
         "applications[0].deployments[1].autoscaling_config.policy.kwargs"),
        (lambda c: _app(c)["runtime_env"].update(env_var={}),
         "applications[0].runtime_env.env_var"),
    ],
    ids=["top level", "http_options", "deployment", "ray_actor_options", "autoscaling policy",
         "runtime_env"],
)
def test_unknown_serve_key_is_named_by_its_place(tmp_path, mutate, place):
    assert f"{place}: unknown key" in _problems_of(tmp_path, mutate)


@pytest.mark.parametrize(
    "mutate, place",
    [
        (lambda c: c["http_options"].update(port="eighty"), "http_options.port"),
        (lambda c: _app(c)["deployments"][0].update(max_ongoing_requests="many"),
         "applications[0].deployments[0].max_ongoing_requests"),
        (lambda c: _app(c)["deployments"][0]["backpressure_config"].update(status_code=500),
         "applications[0].deployments[0].backpressure_config.status_code"),
        # a plain dict to Serve's schema until it deploys: checked with Serve's AutoscalingConfig
        (lambda c: _app(c)["deployments"][1]["autoscaling_config"].update(min_replicas="one"),
         "applications[0].deployments[1].autoscaling_config.min_replicas"),
        (lambda c: _app(c)["runtime_env"]["env_vars"].update(X=1), "applications[0].runtime_env"),
        (lambda c: _app(c)["args"]["limits"].update(max_seq_tokens="long"),
         "applications[0].args.limits.max_seq_tokens"),
    ],
    ids=["http_options", "deployment", "backpressure", "autoscaling_config", "runtime_env",
         "args"],
)
def test_wrong_value_is_named_by_its_place(tmp_path, mutate, place):
    assert f"\n  {place}: " in _problems_of(tmp_path, mutate)


def test_every_problem_is_reported_at_once(tmp_path):
    def mutate(config):
        config["http_options"].update(port="eighty", bogus=1)
        _app(config)["deployments"][1].update(max_concurrent_queries=5)

    message = _problems_of(tmp_path, mutate)
    assert "3 problem(s)" in message
    for place in ("http_options.port", "http_options.bogus",
                  "applications[0].deployments[1].max_concurrent_queries"):
        assert f"\n  {place}: " in message


def test_serve_keys_beyond_those_the_configs_use_are_accepted(tmp_path):
    # The accepted keys are Serve's own (its schema classes), not a copied list.
    config = yaml.safe_load((REPO / "configs" / "score.yaml").read_text())
    worker = _app(config)["deployments"][1]
    worker["ray_actor_options"]["resources"] = {"scorer": 1}
    worker.update(health_check_period_s=5, max_replicas_per_node=1)
    config["http_options"]["keep_alive_timeout_s"] = 10
    path = tmp_path / "more.yaml"
    path.write_text(yaml.safe_dump(config))
    schema = check_config(path)
    assert schema.applications[0].deployments[1].max_replicas_per_node == 1


def test_builder_args_reject_unknown_keys_and_bad_limits():
    with pytest.raises(ValidationError):
        AppConfig.model_validate({"model_pth": "x"})
    with pytest.raises(ValidationError):
        AppConfig.model_validate({"engine": {"precision": "int8"}})
    with pytest.raises(ValidationError):
        AppConfig(limits=Limits(max_seq_tokens=9000),
                  scheduler=SchedulerConfig(max_batch_tokens=8192))
    with pytest.raises(ValidationError, match="needs engine.device 'cuda'"):
        EngineConfig(cuda_graphs={"enabled": True})
    with pytest.raises(ValidationError, match="needs engine.device 'cuda'"):
        AppConfig(scheduler=SchedulerConfig(max_batch_tokens=0))
    with pytest.raises(ValidationError):  # frozen: settings never change after start
        AppConfig().limits.max_seq_tokens = 5


@pytest.mark.parametrize("old, says", [
    ({"prefix_cache_tokens": 4096}, "engine.prefix_cache_tokens moved to engine.prefix_cache"),
    ({"cuda_graph_buckets": [256]}, "moved to engine.cuda_graphs.token_buckets"),
    ({"fp8_linears": ["qkv_proj"]}, "moved to engine.fp8.linears"),
    ({"dequantize_fp8_checkpoint": True}, "moved to engine.fp8.dequantize_checkpoint"),
    ({"dtype": "bfloat16"}, "engine.dtype was removed: the device sets it"),
    ({"attention": "flashinfer"}, "engine.attention was removed"),
    ({"flashinfer_backend": "fa3"}, "engine.flashinfer_backend was removed"),
    ({"fp32_residual": False}, "engine.fp32_residual was removed"),
    ({"cuda_graphs": True}, r"engine.cuda_graphs is a section now: cuda_graphs: \{enabled: true\}"),
])
def test_an_old_engine_key_names_its_new_place(old, says):
    """A config written for the flat engine section fails at start-up, saying where each key
    went (or why it is gone), never silently."""
    with pytest.raises(ValidationError, match=says):
        AppConfig.model_validate({"engine": {"device": "cuda", **old}})


def test_the_engine_holds_the_product_axes_and_derives_the_rest():
    gpu = EngineConfig(device="cuda", precision="fp8", cuda_graphs={"enabled": True},
                       prefix_cache={"tokens": 4096})
    assert (gpu.dtype, gpu.cuda_graphs.enabled, gpu.prefix_cache.enabled) == (
        "bfloat16", True, True)
    assert EngineConfig().dtype == "float32" and not EngineConfig().prefix_cache.enabled
    with pytest.raises(ValidationError, match="token_buckets must be positive"):
        EngineConfig(device="cuda", cuda_graphs={"enabled": True, "token_buckets": [0]})


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


PRODUCT = {"ranker_contract", "serve_app", "gpu_worker", "ranker_app", "ranker_batch"}
# package -> the project packages it may import (besides itself). One direction, no circle:
# ranker_contract < serve_app, gpu_worker < ranker_app, ranker_batch < tools (user-facing
# tools and their libraries) < loadtest (benchmarks) < tests. Scripts (setup, model
# preparation) need only the product. Nothing imports tests: a test runs a tool or a script
# as a process or imports it.
LAYERS = {
    "ranker_contract": set(),
    "serve_app": {"ranker_contract"},
    "gpu_worker": {"ranker_contract"},
    "ranker_app": {"ranker_contract", "serve_app", "gpu_worker"},
    "ranker_batch": {"ranker_contract", "serve_app", "gpu_worker"},
    "tools": PRODUCT,
    "loadtest": PRODUCT | {"tools"},
    "scripts": PRODUCT,
    "tests": PRODUCT | {"tools", "loadtest"},
}


def _python_files(package: str) -> list[Path]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    return files


def _imported_names(path: Path) -> set[str]:
    """Every dotted name `path` imports, anywhere in it (inside functions too); for
    `from a.b import c`, both `a.b` and `a.b.c` (c may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _top_level_imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imported_names(path)}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_packages_import_only_the_layers_below(package):
    wrong = {f"{f.name} imports {name}" for f in _python_files(package)
             for name in (_top_level_imports(f) & LAYERS.keys()) - LAYERS[package] - {package}}
    assert not wrong


@pytest.mark.parametrize("package", sorted(LAYERS.keys() - {"tests"}))
def test_only_tests_import_pytest(package):
    # Tools and the product fail with ordinary exceptions; a test turns them into failures.
    wrong = {f.name for f in _python_files(package) if "pytest" in _top_level_imports(f)}
    assert not wrong


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_import_circle_inside_a_package(package):
    modules = {_module_name(f): f for f in _python_files(package)}
    graph = {}
    for name, path in modules.items():
        # Importing a.b.c runs a, a.b and a.b.c: an edge to each of them that is a module here.
        prefixes = {".".join(dotted.split(".")[:i]) for dotted in _imported_names(path)
                    for i in range(1, dotted.count(".") + 2)}
        graph[name] = (prefixes & modules.keys()) - {name}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        pytest.fail(f"import circle: {' -> '.join(err.args[1])}")


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
    from loadtest.scale_config import variant
    from tools.configs import shipped_yaml

    shipped = {d["name"]: d for d in shipped_yaml("score-gpu.yaml")["applications"][0]
               ["deployments"]}
    ingress = shipped["ScoreIngress"]
    per_scorer = (ingress["num_replicas"]
                  / shipped["ScoreWorker"]["autoscaling_config"]["max_replicas"])
    assert per_scorer == 2
    deployments = {d["name"]: d for d in variant(mode)["applications"][0]["deployments"]}
    assert deployments["ScoreIngress"]["num_replicas"] == scorers * per_scorer
    assert deployments["ScoreIngress"]["max_ongoing_requests"] == ingress["max_ongoing_requests"]
    worker = deployments["ScoreWorker"]
    if mode == "auto":
        assert worker["autoscaling_config"]["max_replicas"] == scorers
    else:
        assert worker["num_replicas"] == scorers and "autoscaling_config" not in worker
    path = tmp_path / f"score-gpu-{mode}.yaml"
    path.write_text(yaml.safe_dump(variant(mode), sort_keys=False))
    check_config(path)


@pytest.mark.parametrize("update, named", [
    ({"adapters": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}, "every name"),
    ({"adapters": [{"name": "smollm2-135m-instruct", "path": "x"}]}, "every name"),
    ({"adapters": [{"name": "", "path": "x"}]}, "name"),
])
def test_adapters_that_cannot_be_served_are_refused_at_start(update, named):
    with pytest.raises(ValidationError, match=named):
        AppConfig.model_validate(update)


def test_a_requests_model_picks_its_adapter_slot_and_an_unknown_one_is_a_404():
    from serve_app.protocol import ApiError
    from serve_app.requests import RequestPath

    path = RequestPath(AppConfig.model_validate(
        {"adapters": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}]}))
    assert [path.adapter_of(m) for m in (None, "smollm2-135m-instruct", "a", "b")] == [0, 0, 1, 2]
    with pytest.raises(ApiError) as exc:
        path.adapter_of("c")
    assert exc.value.status == 404 and exc.value.param == "model"
    assert RequestPath(AppConfig()).adapter_of("anything") == 0  # one model: names not checked
    fp8 = {"adapters": [{"name": "a", "path": "x"}], "engine": {"device": "cuda",
                                                                "precision": "fp8"}}
    assert RequestPath(AppConfig.model_validate(fp8)).adapter_of("a") == 1  # an FP8 base too


def test_models_beside_the_model_have_their_own_names_folders_and_memory_share(tmp_path):
    with pytest.raises(ValidationError, match="every name"):
        AppConfig.model_validate({"adapters": [{"name": "a", "path": "x"}],
                                  "models": [{"name": "a", "path": "y"}]})
    config = AppConfig.model_validate({
        "models": [{"name": "b", "path": "models/b"},
                   {"name": "c", "path": str(tmp_path), "rerank": {"template": "qwen3"}}],
        "adapters": [{"name": "a", "path": "x"}], "multiplex": {"max_models_per_replica": 3}})
    assert config.served_names == ["smollm2-135m-instruct", "a", "b", "c"]
    assert config.memory_share == 0.25 and AppConfig().memory_share == 1.0
    b, c = config.multiplexed("b"), config.multiplexed("c")
    assert (b.served_model_name, b.adapters, b.models) == ("b", [], [])
    assert b.resolved_model_path() == REPO / "models" / "b"  # relative: from the repository
    assert b.rerank == config.rerank and c.rerank.template == "qwen3"
    assert c.resolved_model_path() == tmp_path and c.engine == config.engine
    with pytest.raises(ModelFolderError, match=r"models\[0\] \(b\)"):
        build_app(config)
    for preload, named in ((["b", "x"], r"\['x'\] not among"), (["b", "c"], "more models")):
        with pytest.raises(ValidationError, match=named):
            AppConfig.model_validate({"models": [{"name": "b", "path": "b"},
                                                 {"name": "c", "path": "c"}],
                                      "multiplex": {"preload": preload}})


def test_a_requests_model_picks_the_request_path_of_its_model(default_model_path,
                                                              tiny_classifier):
    """Each model's body is checked by its own route (its vocabulary, its classes), and its
    job names it for the scorer; the model's own requests and its adapters' do not."""
    from serve_app.protocol import ApiError
    from serve_app.requests import RequestPath, ServedModels
    from tools.random_model import default_model_tokenizer

    classifier = tiny_classifier("llama_2class", 49152, default_model_tokenizer())
    config = AppConfig.model_validate({
        "model_path": str(default_model_path), "adapters": [{"name": "a", "path": "x"}],
        "models": [{"name": "cls", "path": str(classifier)}]})
    served = ServedModels(config)

    def parse(body: dict, route: str = "/v1/score"):
        body = {"query": [1, 2], "items": [[3]], "label_token_ids": [1]} | body  # 1: both
        return served.parse(route, json.dumps(body).encode())

    for model, path, adapter in ((None, served.main, 0), ("a", served.main, 1),
                                 ("cls", served.multiplexed["cls"], 0)):
        parsed = parse({"model": model} if model else {})
        assert (parsed.path, parsed.adapter) == (path, adapter)
        assert parsed.model == (model or config.served_model_name)
        tokens = parsed.route.tokenize_now(parsed.request)
        job = parsed.path.pack(parsed.route, tokens, parsed.adapter).job(tokens)
        assert (job.adapter, job.model) == (adapter, "cls" if model == "cls" else None)
    assert parse({"label_token_ids": [500]}).request.label_ids == [500]  # a token of the LM
    with pytest.raises(ApiError) as exc:  # but not a class of the classifier
        parse({"label_token_ids": [500], "model": "cls"})
    assert (exc.value.status, exc.value.param) == (400, "label_token_ids[0]")
    with pytest.raises(ApiError) as exc:
        parse({"model": "nobody"})
    assert (exc.value.status, exc.value.param) == (404, "model")
    with pytest.raises(ApiError, match="offline job"):  # the batch job's path: the model's own
        RequestPath(config).parse("/v1/score", {"model": "cls"})
