"""DNS rebinding and foreign pages: which ``Host`` and ``Origin`` each public listener answers.

A page on another site reaches a listener on the person's machine with the page's ``Origin``,
or, after rebinding its own name to 127.0.0.1, with that name as ``Host``. Real runners on
loopback, and raw requests, so the forged headers go out exactly as written.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import trio

from runner.api import OriginPolicy
from tests.faults._raw import exchange
from tests.runner_process import RunnerProcess, start_runner

PUBLIC = "runner: public listener on "
EVIL = "rebind.example"


def _public(runner: RunnerProcess) -> str:
    (address,) = [line.removeprefix(PUBLIC) for line in runner.stderr if line.startswith(PUBLIC)]
    return address


async def _request(address: str, method: str, path: str, host: str, origin: str | None = None) -> int:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n"
    if origin is not None:
        head += f"Origin: {origin}\r\n"
    status, _, _ = await exchange(address, (head + "\r\n").encode())
    return status


async def _upgrade(address: str, host: str, origin: str | None) -> int:
    """A browser's WebSocket handshake on the agent socket: 101 when it is accepted."""
    key = base64.b64encode(os.urandom(16)).decode()
    head = (
        "GET /v1/agent/stream?session_id=x HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: ino.v2\r\n"
    )
    if origin is not None:
        head += f"Origin: {origin}\r\n"
    with trio.fail_after(10):
        where, port = address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(where, int(port))
        async with stream:
            await stream.send_all((head + "\r\n").encode())
            answer = b""
            while b"\r\n" not in answer:
                data = await stream.receive_some(4096)
                assert data, answer
                answer += data
    return int(answer.split()[1])


async def test_dev_answers_only_its_own_host_and_pages_of_its_own_origin(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", command="dev", stdin=True) as runner:
        address = _public(runner)
        port = address.rsplit(":", 1)[1]
        own = f"http://{address}"
        # A rebound name: the page, the key mint, the journal, the settings, the socket: refused.
        for method, path in (
            ("GET", "/"),
            ("POST", "/dev/session"),
            ("GET", "/dev/events?from=0"),
            ("PATCH", "/dev/sessions/dev"),
        ):
            assert await _request(address, method, path, f"{EVIL}:{port}") == 421, path
            assert await _request(address, method, path, f"{EVIL}:{port}", f"http://{EVIL}:{port}") == 421
        assert await _upgrade(address, f"{EVIL}:{port}", f"http://{EVIL}:{port}") == 421
        # Another site's page, by the listener's own address: refused, the socket's handshake too.
        assert await _request(address, "POST", "/dev/session", address, "https://evil.example") == 403
        assert await _request(address, "GET", "/dev/events?from=0", address, "null") == 403
        assert await _upgrade(address, address, "https://evil.example") == 403
        # The listener's own names: the page, and the page's own requests and socket.
        for host in (address, f"localhost:{port}", f"LocalHost.:{port}", f"app.localhost:{port}"):
            assert await _request(address, "GET", "/", host) == 200, host
        assert await _request(address, "POST", "/dev/session", address, own) == 201
        assert (
            await _request(address, "POST", "/dev/session", f"localhost:{port}", f"http://localhost:{port}")
            == 201
        )
        assert await _upgrade(address, address, own) == 101
        # A client that is no page (no Origin) is not refused.
        assert await _upgrade(address, address, None) == 101
        runner.signal(2)
        assert await runner.wait_exit() == 0


async def test_dev_answers_the_hosts_and_origins_it_is_told_to(tmp_path: Path) -> None:
    """Exposed on purpose (a container's port, a name on the LAN): the allow-lists say to whom."""
    async with start_runner(
        tmp_path / "j.db",
        "--allow-host",
        "devbox.lan",
        "--allow-origin",
        "https://tools.example",
        command="dev",
        stdin=True,
        env={"CURB_ALLOW_HOSTS": "ignored.example", "CURB_ALLOW_ORIGINS": "https://other.example"},
    ) as runner:
        address = _public(runner)
        port = address.rsplit(":", 1)[1]
        assert await _request(address, "GET", "/", f"devbox.lan:{port}") == 200
        # A flag wins over its variable, as every setting's does.
        assert await _request(address, "GET", "/", f"ignored.example:{port}") == 421
        assert await _upgrade(address, address, "https://tools.example") == 101
        assert await _upgrade(address, address, "https://other.example") == 403
        assert await _request(address, "GET", "/", f"{EVIL}:{port}") == 421
        runner.signal(2)
        assert await runner.wait_exit() == 0
    async with start_runner(
        tmp_path / "k.db", command="dev", stdin=True, env={"CURB_ALLOW_HOSTS": "devbox.lan, box2.lan"}
    ) as runner:
        address = _public(runner)
        port = address.rsplit(":", 1)[1]
        assert await _request(address, "GET", "/", f"box2.lan:{port}") == 200
        assert await _request(address, "GET", "/", f"{EVIL}:{port}") == 421
        runner.signal(2)
        assert await runner.wait_exit() == 0


async def test_serve_answers_every_origin_unless_told_which(tmp_path: Path) -> None:
    """The public listener of ``runner serve`` faces apps' pages on their own sites, and holds
    no ambient credential (tokens travel in a header or the auth frame): any Host and Origin by
    default; ``--allow-origin`` and ``--allow-host`` narrow it (docs/operations.md)."""
    async with start_runner(tmp_path / "j.db") as runner:
        address = _public(runner)
        assert await _upgrade(address, address, "https://app.example") == 101
        assert (
            await _upgrade(address, f"api.example:{address.rsplit(':', 1)[1]}", "https://app.example") == 101
        )
        runner.signal(2)
        assert await runner.wait_exit() == 0
    async with start_runner(
        tmp_path / "k.db", "--allow-origin", "https://app.example", "--allow-host", "api.example"
    ) as runner:
        address = _public(runner)
        api = f"api.example:{address.rsplit(':', 1)[1]}"
        assert await _upgrade(address, api, "https://app.example") == 101
        assert await _upgrade(address, api, "https://evil.example") == 403
        assert await _upgrade(address, api, None) == 101  # a server's client sends no Origin
        assert await _upgrade(address, api.replace("api.", "other."), "https://app.example") == 421
        assert await _request(address, "POST", "/v1/ephemeral-keys", api, "https://evil.example") == 403
        runner.signal(2)
        assert await runner.wait_exit() == 0


def test_a_host_names_the_dev_listener_only_as_a_whole() -> None:
    """Forged shapes of Host: a loopback name with something after it names another host."""
    dev = OriginPolicy.for_dev("127.0.0.1", [], [])
    named = ["127.0.0.1:7080", "[::1]:7080", "[::1]", "LocalHost.", "app.localhost:1", "127.0.0.2"]
    assert all(dev.host_allowed(host) for host in named)
    forged = ["[::1]rebind.example", "[::1]:80x", "127.0.0.1@rebind.example", "localhost:80:rebind.example"]
    forged += ["localhost.rebind.example", "10.0.0.5:7080", "rebind.example:7080", ""]
    assert not any(dev.host_allowed(host) for host in forged)
    # Bound to every address: any address names it, a name still does not.
    anywhere = OriginPolicy.for_dev("0.0.0.0", [], [])
    assert anywhere.host_allowed("10.0.0.5:7080") and not anywhere.host_allowed("rebind.example:7080")
    # The page's own origin is the one that names the Host it was sent to, scheme http(s).
    assert dev.origin_allowed("http://127.0.0.1:7080", "127.0.0.1:7080")
    assert not dev.origin_allowed("http://127.0.0.1:7081", "127.0.0.1:7080")
    assert not dev.origin_allowed("file://127.0.0.1:7080", "127.0.0.1:7080")
    assert not dev.origin_allowed("null", "127.0.0.1:7080")
