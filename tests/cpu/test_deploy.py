"""deploy/: the KubeRay RayService manifest is generated from configs/score-gpu.yaml and current,
its structure is what KubeRay needs, and the Dockerfiles parse (BuildKit's own parser) and only
copy what exists."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile
import pytest
import yaml

from ranker_app.check_config import check_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy"))
import make_rayservice  # noqa: E402  (a script, not a package)

MANIFEST = REPO / "deploy" / "rayservice.yaml"
DOCKERFILES = {"cpu": REPO / "deploy" / "Dockerfile.cpu", "gpu": REPO / "deploy" / "Dockerfile.gpu"}
INSTRUCTIONS = {"FROM", "RUN", "COPY", "WORKDIR", "ENV", "EXPOSE", "CMD", "ARG", "LABEL", "USER",
                "ENTRYPOINT"}


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


@pytest.fixture(scope="module")
def gpu_config() -> dict:
    return yaml.safe_load((REPO / "configs" / "score-gpu.yaml").read_text())


def ray_pin() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(re.fullmatch(r"ray\[[a-z,]+\]==(\S+)", d).group(1) for d in deps
                if d.startswith("ray["))


def scorer(config: dict) -> dict:
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == "ScoreWorker")


def test_committed_manifest_is_what_the_script_writes():
    assert MANIFEST.read_text() == make_rayservice.render(), (
        "deploy/rayservice.yaml is stale: run python deploy/make_rayservice.py")


def test_serve_config_is_the_gpu_config_listening_on_the_pod(manifest, gpu_config, tmp_path):
    serve_config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    # The two differences: Kubernetes Services reach the proxy on the pod's address, and the
    # ingress reads its API keys from the mounted Secret.
    assert serve_config["http_options"].pop("host") == "0.0.0.0"
    assert gpu_config["http_options"].pop("host") == "127.0.0.1"
    auth = serve_config["applications"][0]["args"].pop("auth")
    assert auth == {"api_keys_file": make_rayservice.KEYS_FILE}
    assert "auth" not in gpu_config["applications"][0]["args"]  # off in the shipped config
    assert serve_config == gpu_config
    # And it passes the project's strict check, as the shipped file does.
    path = tmp_path / "serve.yaml"
    path.write_text(manifest["spec"]["serveConfigV2"])
    check_config(path)


def test_manifest_structure(manifest, gpu_config):
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    assert set(manifest["spec"]) == {"serveConfigV2", "rayClusterConfig"}
    cluster = manifest["spec"]["rayClusterConfig"]
    assert set(cluster) <= {"rayVersion", "authOptions", "enableInTreeAutoscaling",
                            "headGroupSpec", "workerGroupSpecs"}
    assert cluster["rayVersion"] == ray_pin()
    assert cluster["authOptions"] == {"mode": "token"}  # Ray's token authentication stays on

    head = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert len(head) == 1
    ports = {p["containerPort"] for p in head[0]["ports"]}
    assert {8000, 8265} <= ports and gpu_config["http_options"]["port"] in ports
    assert "nvidia.com/gpu" not in head[0]["resources"]["limits"]
    # KubeRay deploys serveConfigV2 only once the head is Ready: its probe must not need the app.
    assert "readinessProbe" not in head[0]

    groups = cluster["workerGroupSpecs"]
    assert len(groups) == 1
    group = groups[0]
    assert set(group) <= {"groupName", "replicas", "minReplicas", "maxReplicas",
                          "rayStartParams", "template"}
    worker = scorer(gpu_config)
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == worker["ray_actor_options"]["num_gpus"] == 1
    # One GPU pod per scorer replica, as many as the config's autoscaling allows.
    scaling = worker["autoscaling_config"]
    assert (group["minReplicas"], group["maxReplicas"]) == (scaling["min_replicas"],
                                                             scaling["max_replicas"])
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    probe = group["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["exec"]["command"][-1].endswith(f":{gpu_config['http_options']['port']}/health")


def test_every_pod_mounts_the_api_keys_secret_where_the_config_reads_it(manifest):
    cluster = manifest["spec"]["rayClusterConfig"]
    specs = [cluster["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    keys_file = Path(make_rayservice.KEYS_FILE)
    for spec in specs:
        volume = next(v for v in spec["volumes"] if v["name"] == "api-keys")
        assert volume["secret"]["secretName"] == make_rayservice.KEYS_SECRET
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "api-keys")
        assert Path(mount["mountPath"]) == keys_file.parent and mount["readOnly"]
    assert f"--from-file={keys_file.name}=" in MANIFEST.read_text()  # the command to make it


def test_images_are_the_gpu_image(manifest):
    cluster = manifest["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]]
    images = {c["image"] for t in templates for c in t["spec"]["containers"]}
    assert images == {make_rayservice.IMAGE_GPU}
    assert f"-t {make_rayservice.IMAGE_GPU} ." in DOCKERFILES["gpu"].read_text()


def _dockerignored() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_parses_and_copies_what_exists(kind):
    commands = dockerfile.parse_file(str(DOCKERFILES[kind]))
    assert {c.cmd for c in commands} <= INSTRUCTIONS
    base = [c.value[0] for c in commands if c.cmd == "FROM"]
    assert base == [f"rayproject/ray:{ray_pin()}-py311-{kind}"]  # Ray as pinned, every node
    ignored = _dockerignored()
    for copy in (c for c in commands if c.cmd == "COPY"):
        for source in copy.value[:-1]:
            assert (REPO / source).exists(), f"{kind}: COPY {source}: not in the repository"
            assert source.split("/")[0] not in ignored, f"{kind}: {source} is .dockerignored"
    runs = " ".join(" ".join(c.value) for c in commands if c.cmd == "RUN")
    exposed = {p for c in commands if c.cmd == "EXPOSE" for p in c.value}
    assert {"8000", "8265"} <= exposed
    if kind == "gpu":
        assert 'pip install --no-cache-dir -e ".[gpu]"' in runs
        assert "python -m tools.random_model" in runs
    else:
        assert "download.pytorch.org/whl/cpu" in runs and "scripts/prepare_model.py" in runs


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_scripts_run_at_build_find_their_imports_in_the_image(kind, tmp_path):
    # The image holds only what its COPY lines bring (tests are .dockerignored): a script or
    # tool importing anything else fails at `docker build`. `--help` runs its imports.
    commands = dockerfile.parse_file(str(DOCKERFILES[kind]))
    for copy in (c for c in commands if c.cmd == "COPY"):
        for source in copy.value[:-1]:
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, tmp_path / source,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(REPO / source, tmp_path / source)
    runs = " ".join(" ".join(c.value) for c in commands if c.cmd == "RUN")
    runnable = ([[script] for script in re.findall(r"scripts/\w+\.py", runs)]
                + [["-m", module] for module in re.findall(r"python -m (tools\.\w+)", runs)])
    assert runnable
    for command in runnable:
        out = subprocess.run([sys.executable, *command, "--help"], cwd=tmp_path,
                             capture_output=True, text=True)
        assert out.returncode == 0, f"{kind}: {command}: {out.stderr[-2000:]}"


def test_container_serve_config_is_the_shipped_one_on_all_interfaces(tmp_path):
    # What Dockerfile.cpu runs at build time for its one-container CMD.
    out = tmp_path / "score.yaml"
    subprocess.run([sys.executable, "deploy/make_rayservice.py", "--serve-config",
                    "configs/score.yaml", str(out)], cwd=REPO, check=True)
    written = yaml.safe_load(out.read_text())
    shipped = yaml.safe_load((REPO / "configs" / "score.yaml").read_text())
    assert written["http_options"].pop("host") == "0.0.0.0"
    shipped["http_options"].pop("host")
    assert written == shipped


def test_the_batch_rayjob_runs_the_batch_cli_on_the_gpu_image():
    """deploy/rayjob.yaml: its entrypoint is a command line the batch CLI accepts, on the GPU
    image and the pinned Ray, one GPU per worker pod."""
    from ranker_batch.__main__ import parse_args

    job = yaml.safe_load((REPO / "deploy" / "rayjob.yaml").read_text())
    assert job["kind"] == "RayJob" and job["spec"]["shutdownAfterJobFinishes"] is True
    command = job["spec"]["entrypoint"].split()
    assert command[:3] == ["python", "-m", "ranker_batch"]
    args = parse_args(command[3:])
    assert (REPO / args.config).is_file() and args.kind in ("score", "rerank")
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray_pin()
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    assert {c["image"] for p in pods for c in p["template"]["spec"]["containers"]} == {
        make_rayservice.IMAGE_GPU}
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
