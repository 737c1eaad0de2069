"""The manifests in deploy/ name only what the runner has: commands, flags, ports, probes.

Each command line is parsed by the runner's own argument parser; each probe path is asked,
without a token (as a kubelet asks), of a real runner on loopback.
"""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from runner.cli import _parser
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
        assert grace_s * 1000 > args.drain_grace_ms
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
    assert int(service["TimeoutStopSec"]) * 1000 > args.drain_grace_ms


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
