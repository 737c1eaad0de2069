"""What the HTTP layer itself answers and refuses, on both listeners (issue 27, items 6, 9, 11 and 17).

Each request goes over a raw socket, as an attacker or a broken client would send it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from jsonschema import Draft202012Validator

from ..runner_process import TOKEN
from ..test_protocol_schema import _validator
from ..websocket.ino_client import API_KEY, BackgroundRunner
from ._raw import closed_by_peer, read_answer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundRunner]:
    runner = BackgroundRunner(tmp_path_factory.mktemp("http") / "j.db", agent="text_only")
    try:
        yield runner
    finally:
        runner.stop()
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr[-40:])


def _listeners(runner: BackgroundRunner) -> dict[str, tuple[str, str]]:
    """Each listener's address and a credential it takes."""
    return {
        "management": (runner.addresses.management, TOKEN),
        "public": (runner.addresses.public, API_KEY),
    }


async def _connect(address: str) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


def _error_body(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    validator: Draft202012Validator = _validator("ErrorBody")
    assert headers.get("content-type") == "application/json", headers
    value: dict[str, Any] = json.loads(body)
    validator.validate(value)
    return value


async def _refused_and_closed(address: str, request: bytes) -> tuple[int, dict[str, Any], bytes]:
    """Send ``request``: its one answer, an ErrorBody, then the connection closes with nothing more."""
    stream = await _connect(address)
    async with stream:
        await stream.send_all(request)
        with trio.fail_after(10):
            status, headers, body = await read_answer(stream)
        error = _error_body(headers, body)
        rest = b""
        with trio.move_on_after(10):
            try:
                while data := await stream.receive_some(65536):
                    rest += data
            except trio.BrokenResourceError:
                pass
        return status, error, rest


async def test_a_request_with_two_framings_is_refused_and_its_connection_closed(
    runner: BackgroundRunner,
) -> None:
    # Content-Length says the body is the whole rest; chunked says it ends at once, and what
    # follows is a second request: a proxy reading one and the runner the other disagree on
    # where requests begin (RFC 9112 6.3). Before, the second one ran, authenticated.
    for name, (address, credential) in _listeners(runner).items():
        smuggled = (
            f"POST /v1/ephemeral-keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {credential}\r\n"
            'Content-Type: application/json\r\nContent-Length: 27\r\n\r\n{"end_user_id":"smuggled"}\n'
        ).encode()
        for framing in (
            b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n",
            b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n",
            b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\nContent-Length: %d\r\n",
        ):
            rest = b"0\r\n\r\n" + smuggled
            head = b"POST /health HTTP/1.1\r\nHost: x\r\n" + framing.replace(b"%d", str(len(rest)).encode())
            status, error, after = await _refused_and_closed(address, head + b"\r\n" + rest)
            assert (status, error["error"]) == (400, "invalid_request"), (name, framing)
            assert "Content-Length and Transfer-Encoding" in error["detail"]
            assert after == b"", (name, after[:200])


async def test_http2_is_not_offered(runner: BackgroundRunner) -> None:
    for name, (address, _) in _listeners(runner).items():
        # HTTP/2 with prior knowledge: Hypercorn answered with HTTP/2's SETTINGS frame.
        status, error, _ = await _refused_and_closed(address, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert (status, error["error"]) == (505, "invalid_request"), name
        # An upgrade to h2c is ignored: the request is answered in HTTP/1.1 (before: 101).
        stream = await _connect(address)
        async with stream:
            await stream.send_all(
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
            )
            with trio.fail_after(10):
                status, headers, _ = await read_answer(stream)
            assert status in (200, 404), (name, status)
            assert "upgrade" not in headers, headers
            # And the connection is still HTTP/1.1.
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            with trio.fail_after(10):
                assert (await read_answer(stream))[0] == status


HTTP_LAYER_REFUSALS: dict[str, tuple[bytes, int]] = {
    "a malformed request line": (b"GET / HTTP/1.1 x\r\nHost: x\r\n\r\n", 400),
    "not HTTP at all": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    "a header without a colon": (b"GET /health HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n", 400),
    "a space before the colon": (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length : 0\r\n\r\n", 400),
    "a head over 16 KiB": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", 431),
    "a transfer coding other than chunked": (
        b"POST /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        501,
    ),
    "a WebSocket handshake with no key": (
        b"GET /v1/agent/stream HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n",
        400,
    ),
}


async def test_the_http_layers_own_refusals_carry_an_error_body(runner: BackgroundRunner) -> None:
    for name, (address, _) in _listeners(runner).items():
        for case, (request, expected) in HTTP_LAYER_REFUSALS.items():
            status, error, _ = await _refused_and_closed(address, request)
            assert (status, error["error"]) == (expected, "invalid_request"), (name, case)
            assert error["detail"], (name, case)
    # The listeners still answer.
    for address, _ in _listeners(runner).values():
        stream = await _connect(address)
        async with stream:
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            with trio.fail_after(10):
                assert (await read_answer(stream))[0] in (200, 404)
            assert await closed_by_peer(stream, timeout=5)


async def _read_head(stream: trio.SocketStream) -> tuple[int, bytes]:
    """A HEAD request's answer: its status and head; nothing may follow it."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        assert data, f"the connection closed before an answer: {buffer!r}"
        buffer += data
    head, rest = buffer.split(b"\r\n\r\n", 1)
    assert rest == b"", rest[:200]
    return int(head.split()[1]), head


async def _followers(runner: BackgroundRunner) -> int:
    async with runner.addresses.management_client() as client:
        metrics = (await client.get("/v1/metrics")).text
    return int(
        float(
            next(line for line in metrics.splitlines() if line.startswith("curb_stream_followers ")).split()[
                1
            ]
        )
    )


HEAD_TARGETS = {
    "management": ["/v1/runner/events", "/v1/runner/events?from=0", "/health", "/v1/runner", "/v1/metrics"],
    "public": ["/v1/agent/relations", "/v1/agent/sessions/nobody/messages", "/nowhere"],
}


async def test_head_ends_with_its_head_and_the_connection_goes_on(runner: BackgroundRunner) -> None:
    # Before, HEAD /v1/runner/events never ended: the next request on its connection got no
    # answer, and the follower was held after the client left.
    for name, (address, credential) in _listeners(runner).items():
        stream = await _connect(address)
        async with stream:
            for target in HEAD_TARGETS[name]:
                await stream.send_all(
                    f"HEAD {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {credential}\r\n\r\n".encode()
                )
                with trio.fail_after(10):
                    status, head = await _read_head(stream)
                assert status in (200, 404), (name, target, head)
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            with trio.fail_after(10):
                assert (await read_answer(stream))[0] in (200, 404), name
    with trio.fail_after(10):
        while await _followers(runner):
            await trio.sleep(0.1)
