"""Bad input answers its documented code and changes nothing; the runner stays healthy.

Each case was seen answering 500, hanging a connection or corrupting another call's
writes before (issue 14, items 6 to 11).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from ..runner_process import TOKEN, read_stream, records, start_runner
from ..websocket.ino_client import API_KEY, connect, start_ino_runner
from ._raw import closed_by_peer, exchange, read_answer
from ._runner import start

pytestmark = pytest.mark.slow

MESSENGER = "tests.agents:messenger"


def _body(session_id: str = "ok", **extra: Any) -> bytes:
    return json.dumps(start(session_id, **extra)).encode()


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


BAD_STARTS: dict[str, bytes] = {
    "lone surrogate": b'{"sessionId":"p\\ud800","realtimeUrl":"loopback:","realtimeToken":"t"}',
    "lone low surrogate": b'{"sessionId":"\\udc00p","realtimeUrl":"loopback:","realtimeToken":"t"}',
    "the runner's producer": _body("runner"),
    "a slash": _body("a/b"),
    "a path": _body("../../etc/passwd"),
    "a space": _body("a b"),
    "a percent": _body("a%2Fb"),
    "too long": _body("x" * 129),
    "non-ASCII": _body("café"),
    "a surrogate in clientContext": b'{"sessionId":"ok1","realtimeUrl":"loopback:","realtimeToken":"t",'
    b'"clientContext":{"k":"\\ud800"}}',
    "1e999": b'{"sessionId":"ok2","realtimeUrl":"loopback:","realtimeToken":"t","configurationVersion":1e999}',
    "nested 1000 deep": b'{"sessionId":"ok3","realtimeUrl":"loopback:","realtimeToken":"t","x":'
    + _deep(1000).encode()
    + b"}",
    "nested 200 deep": b'{"sessionId":"ok4","realtimeUrl":"loopback:","realtimeToken":"t","x":'
    + _deep(200).encode()
    + b"}",
}

WRONG_SHAPES: list[tuple[str, Any, str]] = [
    ("clientContext", ["a"], "expected an object"),
    ("clientContext", "a=b", "expected an object"),
    ("experiments", 7, "expected an object"),
    ("direction", ["inbound"], "is not one of the allowed values"),
    ("sessionId", {"a": 1}, "expected a string"),
    ("configurationVersion", [1], "expected an integer"),
]

BAD_MESSAGES: dict[str, bytes] = {
    "1e999": b'{"id":"m1","name":"note","payload":{"n":1e999}}',
    "-1e999": b'{"id":"m2","name":"note","payload":{"n":-1e999}}',
    "lone surrogate": b'{"id":"m3","name":"note","payload":{"s":"\\ud800"}}',
    "surrogate key": b'{"id":"m4","name":"note","payload":{"\\udfff":1}}',
    "nested 1000 deep": b'{"id":"m5","name":"note","payload":{"x":' + _deep(1000).encode() + b"}}",
    "nested 5000 deep": b'{"id":"m6","name":"note","payload":{"x":' + _deep(5000).encode() + b"}}",
}


async def test_bad_bodies_are_400_and_change_nothing(tmp_path: Path) -> None:
    async with (
        start_runner(
            tmp_path / "j.db", "--max-sessions", "8", "--drain-grace-ms", "100", agent=MESSENGER
        ) as runner,
        runner.client() as client,
    ):
        assert (await client.post("/v1/sessions", json=start("live"))).status_code == 202
        headers = {"content-type": "application/json"}
        for case, body in BAD_STARTS.items():
            answer = await client.post("/v1/sessions", content=body, headers=headers)
            assert answer.status_code == 400, (case, answer.text)
            assert answer.json()["error"] == "invalid_request", case
        # A body of the wrong structure is told what was expected, never Python's own words
        # (`'list' object has no attribute 'items'` before).
        for field, value, expected in WRONG_SHAPES:
            answer = await client.post("/v1/sessions", json=start("shape", **{field: value}))
            assert answer.status_code == 400, (field, value, answer.text)
            assert answer.json()["issues"] == [{"path": [field], "message": expected}], (field, value)
        for case, body in BAD_MESSAGES.items():
            answer = await client.post("/v1/sessions/live/messages", content=body, headers=headers)
            assert (answer.status_code, answer.json()["error"]) == (400, "invalid_request"), (
                case,
                answer.text,
            )
            patch = await client.patch("/v1/sessions/live", content=body, headers=headers)
            assert (patch.status_code, patch.json()["error"]) == (400, "invalid_request"), (case, patch.text)
        # The agent's own reply nested deep is kept (or refused as the handler's failure), never a 500.
        deep = await client.post(
            "/v1/sessions/live/messages", json={"id": "d1", "name": "deep", "payload": {"depth": 500}}
        )
        assert deep.status_code in (202, 422), "\n".join(runner.stderr[-60:])
        status = (await client.get("/v1/runner")).json()
        assert [s["sessionId"] for s in status["sessions"]] == ["live"]
        assert (await client.get("/health")).status_code == 200
        lines = records(await read_stream(runner, "from=0", until=lambda ls: len(records(ls)) >= 2))
        assert {r["producer"] for r in lines} == {"runner", "live"}
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)


async def test_a_bad_id_never_fails_another_calls_writes(tmp_path: Path) -> None:
    async with (
        start_runner(
            tmp_path / "j.db", "--max-sessions", "8", "--drain-grace-ms", "100", agent=MESSENGER
        ) as runner,
        runner.client() as client,
    ):
        assert (await client.post("/v1/sessions", json=start("other"))).status_code == 202
        answers: list[tuple[str, int]] = []

        async def message(n: int) -> None:
            sent = await client.post(
                "/v1/sessions/other/messages", json={"id": f"m{n}", "name": "note", "payload": {"n": n}}
            )
            answers.append(("message", sent.status_code))

        async def bad_start(n: int) -> None:
            body = b'{"sessionId":"p%d\\ud800","realtimeUrl":"loopback:","realtimeToken":"t"}' % n
            sent = await client.post(
                "/v1/sessions", content=body, headers={"content-type": "application/json"}
            )
            answers.append(("start", sent.status_code))

        async with trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(message, n)
                if n % 4 == 0:
                    nursery.start_soon(bad_start, n)
        assert sorted(set(answers)) == [("message", 202), ("start", 400)]
        assert answers.count(("message", 202)) == 40


async def test_limits_auth_and_handshakes_answer_their_codes(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", agent=MESSENGER) as runner, runner.client() as client:
        big = 2 << 20
        for auth, status, code in ((None, 401, "unauthorized"), (TOKEN, 413, "invalid_request")):
            host, port = runner.address.rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                head = f"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {big}\r\n"
                if auth:
                    head += f"Authorization: Bearer {auth}\r\n"
                await stream.send_all(head.encode() + b"\r\n" + b"{" + b" " * 65536)
                with trio.fail_after(10):
                    got, headers, body = await read_answer(stream)
                assert got == status and json.loads(body)["error"] == code, (got, body)
                # Its connection is closed after the answer rather than left waiting for the body.
                assert headers.get("connection") == "close"
                assert await closed_by_peer(stream)
        # The scheme is case-insensitive (RFC 7235).
        for scheme in ("bearer", "BEARER", "Bearer"):
            answer = await client.get("/v1/runner", headers={"Authorization": f"{scheme} {TOKEN}"})
            assert answer.status_code == 200, scheme
        assert (
            await client.get("/v1/runner", headers={"Authorization": "Basic " + TOKEN})
        ).status_code == 401
        # A WebSocket handshake on the management listener: 401 without the token, 404 with it.
        upgrade = (
            "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
        )
        for path in ("/v1/runner/events", "/nowhere", "/v1/agent/stream"):
            got, _, body = await exchange(runner.address, upgrade.format(path=path, auth="").encode())
            assert (got, json.loads(body)) == (401, {"error": "unauthorized"}), path
            with_token = upgrade.format(path=path, auth=f"Authorization: Bearer {TOKEN}\r\n")
            got, _, body = await exchange(runner.address, with_token.encode())
            assert (got, json.loads(body)["error"]) == (404, "not_found"), path
        assert (await client.get("/health")).status_code == 200
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)


async def test_agent_socket_frames_that_cannot_be_understood_close_4009(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (runner, addresses):
        api = addresses.api()
        for frame in (
            '{"type":"user_message","text":' + _deep(5000) + "}",
            '{"type":"user_message","text":"hi \\ud800"}',
            '{"type":"user_message","text":"hi","speech":1e999}',
        ):
            token, session = await api.person()
            async with connect(addresses, token, session) as sock:
                await sock.send_raw(frame)
                code, _ = await sock.closed()
                assert code == 4009, frame[:60]
        minted = await api.request(
            "POST", "/v1/ephemeral-keys", bearer="ino-test-api-key-5b1e", json_body=None
        )
        assert minted.status_code in (201, 400)
        raw = b'{"end_user_id":"eu\\ud800"}'
        async with api._client("ino-test-api-key-5b1e") as client:
            answer = await client.post(
                "/v1/ephemeral-keys", content=raw, headers={"content-type": "application/json"}
            )
        assert (answer.status_code, answer.json()["error"]) == (400, "invalid_request"), answer.text
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)


async def test_a_path_with_an_empty_segment_is_a_404_error_body_on_both_listeners(tmp_path: Path) -> None:
    # An id ending in %2F made the path hold "//": Werkzeug answered 308 and an HTML page.
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (runner, addresses):
        asked = (
            (addresses.management, "POST", "/v1/sessions/x%2F/messages", TOKEN),
            (addresses.management, "GET", "/v1//runner", TOKEN),
            (addresses.public, "POST", "/v1/ephemeral-keys/x%2F/revoke", API_KEY),
            (addresses.public, "GET", "/v1/agent/sessions/x%2F/messages", API_KEY),
        )
        for address, method, target, credential in asked:
            request = (
                f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {credential}\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            got, headers, body = await exchange(address, request.encode())
            assert (got, headers.get("content-type"), json.loads(body)["error"]) == (
                404,
                "application/json",
                "not_found",
            ), (target, body[:200])
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)
