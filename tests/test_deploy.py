"""The manifests in deploy/ name only what the runner has: commands, flags, ports, probes.

Each command line is parsed by the runner's own argument parser; each probe path is asked,
without a token (as a kubelet asks), of a real runner on loopback.
"""

from __future__ import annotations

import configparser
import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from runner.cli import _config, _parser
from runner.config import parse_address
from runner.worker import agent_url

from .agents import quiet
from .inprocess import open_runner

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"


def _containers() -> list[dict[str, Any]]:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "worker.yaml").read_text()))
    (deployment,) = [d for d in documents if d and d.get("kind") == "Deployment"]
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert containers
    return containers


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion, from the container's literal env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


def _start_args(argv: list[str]) -> Any:
    assert argv[0] == "runner", argv
    args = _parser().parse_args(argv[1:])
    assert args.command == "start", argv
    return args


def test_the_kubernetes_worker_runs_runner_start_with_flags_it_has() -> None:
    for container in _containers():
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        args = _start_args([_expand(a, env) for a in container["command"]])
        agent_url(args.url)
        # Secrets come from the environment, as the runner reads them.
        names = {e["name"] for e in container["env"]}
        assert {"LIVEKIT_API_KEY", "LIVEKIT_API_SECRET", "CURB_MANAGEMENT_TOKEN"} <= names
        # The probes ask the port the management listener binds.
        _, port = parse_address(args.address)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert ports.get(get["port"], get["port"]) == port, probe
        # The journal is on the mounted volume; the pod waits for the longest drain.
        mounts = [m["mountPath"] for m in container["volumeMounts"]]
        assert any(args.journal.startswith(m + "/") for m in mounts)
        grace_s = yaml.safe_load((DEPLOY / "kubernetes" / "worker.yaml").read_text())["spec"]["template"][
            "spec"
        ]["terminationGracePeriodSeconds"]
        # Through the runner's own config, so the value is the one it would run with.
        assert grace_s * 1000 > _config(args, "worker").drain_grace_ms
        assert container["lifecycle"]["preStop"]["exec"]["command"][:2] == ["/bin/sh", "-c"]


def test_the_systemd_unit_runs_runner_start_with_flags_it_has() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str
    unit.read_string((DEPLOY / "systemd" / "curb-worker@.service").read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"].replace("%i", "1"))
    assert argv[0].endswith("/runner")
    args = _start_args(["runner", *argv[1:]])
    assert parse_address(args.address) == ("127.0.0.1", 7101)
    assert args.journal.endswith("worker-1.db")
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) * 1000 > _config(args, "worker").drain_grace_ms


def test_the_docs_quote_the_manifests() -> None:
    docs = DOCS.read_text()
    for manifest in ("deploy/kubernetes/worker.yaml", "deploy/systemd/curb-worker@.service"):
        assert manifest in docs
    assert "terminationGracePeriodSeconds: 1860" in docs


@pytest.mark.parametrize("probe", ["readinessProbe", "livenessProbe"])
async def test_every_probe_path_answers_200_without_a_token(probe: str, tmp_path: Path) -> None:
    paths = {c[probe]["httpGet"]["path"] for c in _containers()}
    async with open_runner(quiet, tmp_path) as runner, httpx.AsyncClient() as client:
        for path in paths:
            answer = await client.get(f"http://{runner.address}{path}")
            assert answer.status_code == 200, (path, answer.text)


DOCKERFILE = DEPLOY / "Dockerfile"
REPO = DEPLOY.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
# What the image's build context leaves out (.dockerignore): nothing of the package's own.
IGNORED = shutil.ignore_patterns(
    ".git", "__pycache__", "*.egg-info", "node_modules", ".venv*", "*_cache", "build"
)


def _stages() -> dict[str, list[tuple[str, str]]]:
    """The Dockerfile's stages by name, each its instructions in order (FROM first)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8")).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, rest = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            named = re.fullmatch(r"(\S+)(?:\s+as\s+(\S+))?", rest.strip(), re.I)
            assert named, line
            current = stages.setdefault(named[2] or "", [])
            current.append(("FROM", named[1]))
        else:
            current.append((instruction.upper(), rest.strip()))
    return stages


def _copied(stage: list[tuple[str, str]]) -> dict[str, str]:
    """Each COPY source of a stage, with its destination."""
    copied = {}
    for instruction, rest in stage:
        if instruction == "COPY":
            *sources, destination = shlex.split(rest)
            assert not any(s.startswith("--") for s in sources), rest
            copied.update({s.rstrip("/"): destination for s in sources})
    return copied


def _build_wheel(source: Path, into: Path) -> set[str]:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--quiet", "--no-cache-dir"]
    subprocess.run(
        [*pip, "--no-deps", "--no-build-isolation", "--wheel-dir", str(into), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = into.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.mark.slow
def test_the_image_installs_what_pip_install_does(tmp_path: Path) -> None:
    stages = _stages()
    runner = stages["runner"]
    # A Python the package takes.
    base = runner[0][1]
    version = re.fullmatch(r"python:(\d+\.\d+)[-\w.]*", base)
    assert version, base
    assert SpecifierSet(PROJECT["project"]["requires-python"]).contains(version[1] + ".0"), base
    # Two installs: the package itself with no extra, then the end-of-turn model's wheel without
    # its dependencies, the one .ci/install-smart-turn installs; nothing else.
    runs = " && ".join(
        rest for stage in stages.values() for instruction, rest in stage if instruction == "RUN"
    )
    installs = re.findall(r"\bpip3?\s+install\s+([^&;|]*)", runs)
    assert len(installs) == 2 and len(re.findall(r"\bpip3?\s", runs)) == 2, runs
    assert [a for a in shlex.split(installs[0]) if not a.startswith("-")] == ["."], installs
    model = shlex.split(installs[1])
    assert "--no-deps" in model, installs
    (wheel,) = [a for a in model if not a.startswith("-")]
    assert f"'{wheel}'" in (REPO / ".ci" / "install-smart-turn").read_text(), wheel
    assert not re.search(r"\b(apt-get|apt|apk|dnf|yum|conda|uv)\b", runs), runs
    # It copies the package's own files: its metadata, its readme and every package it ships.
    include = PROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {
        p.name for p in REPO.iterdir() if p.is_dir() and any(fnmatch.fnmatch(p.name, i) for i in include)
    }
    copied = _copied(runner)
    assert set(copied) == {"pyproject.toml", PROJECT["project"]["readme"], *packages}, copied
    # Built from only those files, the package is the one a clone builds, file for file.
    image_src = tmp_path / "image-src"
    for name in copied:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, image_src / name, ignore=IGNORED)
        else:
            image_src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, image_src / name)
    clone = tmp_path / "clone"
    shutil.copytree(REPO, clone, ignore=IGNORED)
    from_clone = _build_wheel(clone, tmp_path / "clone-wheel")
    assert _build_wheel(image_src, tmp_path / "image-wheel") == from_clone
    assert "runner/protocol.schema.json" in from_clone and "migrations/0001_journal.sql" in from_clone


def test_the_manifest_runs_the_image_docs_deploy_builds() -> None:
    stages = _stages()
    # The default target is the worker: the runner with the agents the manifest names.
    assert list(stages) == ["runner", "worker"] and stages["worker"][0] == ("FROM", "runner")
    (container,) = _containers()
    build = f"docker build -f deploy/Dockerfile -t {container['image']} ."
    assert build in DOCS.read_text(encoding="utf-8") and build in DOCKERFILE.read_text(encoding="utf-8")
    # Its command is the package's own script, and imports the agent from the working directory.
    assert container["command"][0] in PROJECT["project"]["scripts"]
    args = _start_args(container["command"])
    workdir = [rest for instruction, rest in stages["runner"] if instruction == "WORKDIR"][-1]
    package = args.agent.split(".")[0]
    assert _copied(stages["worker"]) == {package: f"{workdir}/{package}/"}
    # The journal's directory is the one the image makes for its user.
    assert f"--home-dir {Path(args.journal).parent}" in DOCKERFILE.read_text(encoding="utf-8")
