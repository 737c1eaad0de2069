"""Fixtures for tests against a real livekit-server in a private network namespace.

``livekit`` (per test) is an lk_harness.LiveKitEnv: server URL, API key and
secret, tokens, ``popen``/``open_process`` to run programs inside the
namespace, and ``peer()`` for participant processes. The server itself is
started once per session. Tests using it carry ``@pytest.mark.livekit``.

A missing binary is a failure, not a skip: run .ci/install-livekit-server.

This directory is deliberately not a package (no __init__.py): ``livekit`` is
the SDK's namespace package, and a ``tests/livekit/__init__.py`` would shadow
it whenever ``tests/`` lands on sys.path. Its modules are imported by their own
names (lk_harness, lk_peer), from this directory.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # e.g. under --import-mode=importlib
    sys.path.insert(0, _HERE)

from lk_harness import (  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
    INSTALL_HINT,
    HarnessError,
    LiveKitCluster,
    LiveKitEnv,
    LiveKitServer,
    find_livekit_server,
)
from lk_sip import SIP_INSTALL_HINT, SipEnv, SipStack, find_livekit_sip  # noqa: E402 - as above


@pytest.fixture(scope="session")
def livekit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitServer]:
    binary = find_livekit_server()
    if binary is None:
        pytest.fail(f"livekit-server binary not found; {INSTALL_HINT}", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the LiveKit tests make a network namespace and must run as root", pytrace=False)
    server = LiveKitServer(binary, tmp_path_factory.mktemp("livekit-server"))
    try:
        server.start()
    except HarnessError as exc:
        server.stop()
        pytest.fail(f"could not start livekit-server: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def livekit(livekit_server: LiveKitServer, tmp_path) -> AsyncIterator[LiveKitEnv]:
    if not livekit_server.alive():
        pytest.fail(f"livekit-server is not running:\n{livekit_server.log_tail()}", pytrace=False)
    env = LiveKitEnv(livekit_server, tmp_path)
    try:
        yield env
    finally:
        await env.aclose()
    if not livekit_server.alive():
        pytest.fail(f"livekit-server died during the test:\n{livekit_server.log_tail()}", pytrace=False)


@pytest.fixture
def livekit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitCluster]:
    """Two livekit-server nodes and their redis-server, in a namespace of their own (per test)."""
    binary = find_livekit_server()
    if binary is None:
        pytest.fail(f"livekit-server binary not found; {INSTALL_HINT}", pytrace=False)
    cluster = LiveKitCluster(binary, tmp_path_factory.mktemp("livekit-cluster"))
    try:
        cluster.start()
    except HarnessError as exc:
        cluster.stop()
        pytest.fail(f"could not start the LiveKit cluster: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def sip_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SipStack]:
    """redis-server, livekit-server and LiveKit's SIP service in a namespace of their own."""
    server = find_livekit_server()
    sip = find_livekit_sip()
    if server is None:
        pytest.fail(f"livekit-server binary not found; {INSTALL_HINT}", pytrace=False)
    if sip is None or shutil.which("baresip") is None:
        pytest.fail(f"livekit-sip or baresip not found; {SIP_INSTALL_HINT}", pytrace=False)
    stack = SipStack(server, sip, tmp_path_factory.mktemp("livekit-sip"))
    try:
        stack.start()
    except HarnessError as exc:
        stack.stop()
        pytest.fail(f"could not start the SIP stack: {exc}\n{stack.log_tail()}", pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def sip(sip_stack: SipStack, tmp_path: Path) -> AsyncIterator[SipEnv]:
    """The SIP stack as one test sees it: a LiveKitEnv on its server, and phones."""
    if not sip_stack.alive():
        pytest.fail(f"the SIP stack is not running:\n{sip_stack.log_tail()}", pytrace=False)
    env = SipEnv(sip_stack, tmp_path)
    try:
        yield env
    finally:
        await env.aclose()
    if not sip_stack.alive():
        pytest.fail(f"the SIP stack died during the test:\n{sip_stack.log_tail()}", pytrace=False)
