"""The ino.v2 agent socket under generated client frames: what each example sends, what must hold.

Each example gets a new conversation, connects, authenticates (unless the frame under test
is the one that must come first), then sends the frame and a ``ping`` in one write. What must
hold: the socket answers (a ``pong``, so it lives, or a close frame), never drops TCP without
a close frame, closes only with a documented code (the seed's 4001-4014 but 4013, "failed on
our side"; RFC 6455's 1002, 1007, 1009), every JSON frame it sends is a ServerFrame of the
schema, and a refused frame leaves the conversation without a message.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections import Counter
from typing import Any

import attrs
import httpx
import jsonschema
import trio
from hypothesis import strategies as st

from ..faults._raw import BINARY, CLOSE, PING, TEXT, RawSocket, open_raw_socket, ws_frame
from ..websocket.ino_client import API_KEY, Addresses
from ._cases import INO, Body, bodies, segments, valid
from ._http import Violation

TOKEN_MARK, SESSION_MARK = "@token@", "@session@"
VERBS = tuple(k.removeprefix("verb.") for k in INO["$defs"] if k.startswith("verb."))
FRAMES = (*VERBS, "binary", "unparsable")

# The seed's close codes but 4013 ("the connection failed on our side": the socket's 500),
# and RFC 6455's for a frame that is not WebSocket (docs/operations.md).
DOCUMENTED_CLOSES = {4001, 4002, 4003, 4004, 4005, 4006, 4007, 4008, 4009, 4010, 4011, 4014, 1002, 1007, 1009}
# Closes that refuse the frame under test: nothing of it may be kept.
REFUSING_CLOSES = DOCUMENTED_CLOSES - {4006, 4007}

_SERVER_FRAME = jsonschema.Draft202012Validator({"$defs": INO["$defs"], "$ref": "#/$defs/ServerFrame"})
_PING = ws_frame(TEXT, b'{"type":"ping"}')


@attrs.frozen
class Frame:
    """One client frame as sent, and whether ``auth`` went before it."""

    verb: str
    authenticated: bool
    frame: bytes
    body: Body | None = None
    query: str = f"?session_id={SESSION_MARK}"  # the handshake's: the URL names the session too

    def __repr__(self) -> str:
        shown = repr(self.body) if self.body is not None else repr(self.frame[:200])
        return f"Frame({self.verb}, after auth: {self.authenticated}, {shown})"

    def target(self, session_id: str) -> str:
        return "/v1/agent/stream" + self.query.replace(SESSION_MARK, session_id)

    def bound(self, token: str, session_id: str) -> bytes:
        """The frame with this example's credentials in place of their marks."""
        if self.body is None:
            return self.frame
        data = self.body.data.replace(TOKEN_MARK.encode(), token.encode()).replace(
            SESSION_MARK.encode(), session_id.encode()
        )
        return ws_frame(TEXT, data)


_UNPARSABLE = st.sampled_from(
    [
        ws_frame(TEXT, b'{"type":"ping","x":"\xff"}'),
        ws_frame(TEXT, b'"\xed\xa0\x80"'),
        ws_frame(0x3, b"{}"),
        ws_frame(0xB, b""),
        ws_frame(TEXT, b'{"type":"ping"}', masked=False),
        ws_frame(TEXT, b'{"type":"ping"}', rsv=0b010),
        ws_frame(PING, b"x", fin=False),
        ws_frame(0x0, b"x"),
        ws_frame(CLOSE, b"\x03\xe8\xff"),  # a close whose reason is not UTF-8
        ws_frame(CLOSE, struct.pack("!H", 999)),  # a close code no endpoint may send
    ]
)


@st.composite
def frames(draw: st.DrawFn, verb: str) -> Frame:
    """A client frame of ``verb`` (or raw bytes), valid or broken, before or after ``auth``."""
    if verb == "unparsable":
        return Frame(verb, draw(st.booleans()), draw(_UNPARSABLE))
    if verb == "binary":
        return Frame(verb, draw(st.booleans()), ws_frame(BINARY, draw(st.binary(max_size=4096))))
    override: dict[str, st.SearchStrategy[Any]] = {}
    if verb == "auth":
        override = {
            "key": st.sampled_from([TOKEN_MARK] * 3 + [API_KEY, "ek_nothing_0"]) | st.text(min_size=1),
            "session_id": st.sampled_from([SESSION_MARK] * 3 + ["sess_nothing"]) | st.text(min_size=1),
        }
    body = draw(bodies(valid(INO, f"verb.{verb}", **override)))
    # Auth comes first; any other verb is sent after it, but now and then in its place.
    authenticated = verb != "auth" and draw(st.sampled_from([True] * 5 + [False]))
    if verb != "auth":
        return Frame(verb, authenticated, b"", body)
    # The first frame goes with the handshake's URL: its session id may be missing, another or hostile.
    query = draw(
        st.sampled_from([f"?session_id={SESSION_MARK}"] * 4 + ["", "?session_id=", "?x=1"])
        | segments().map(lambda s: f"?session_id={s}")
    )
    return Frame(verb, authenticated, b"", body, query)


RUNNER_AGENT = "text_only"
RUNNER_ARGS = ("--max-sessions", "64")

TALLY: Counter[str] = Counter()
"""Frames checked, by verb (``python -m bench.fuzz`` prints it)."""
ANSWERS: Counter[tuple[str, str]] = Counter()
"""How the socket took them, by verb: ``"pong"`` (it lives), ``"error invalid_request"``, ``"close 4009"``..."""


@attrs.define
class AgentSocket:
    """The public listener of the runner under test, and one token to make conversations with."""

    addresses: Addresses
    token: str = ""

    def client(self, bearer: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://{self.addresses.public}",
            headers={"Authorization": f"Bearer {bearer}"},
            timeout=20,
        )

    async def mint(self) -> None:
        async with self.client(API_KEY) as client:
            minted = await client.post("/v1/ephemeral-keys", json={"end_user_id": "fuzz"})
        assert minted.status_code == 201, minted.text
        self.token = minted.json()["token"]


def _check_frame(message: dict[str, Any]) -> None:
    errors = list(_SERVER_FRAME.iter_errors(message))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise Violation(f"not a ServerFrame: {best.message} in {json.dumps(message)[:300]}")


async def _exchange(raw: RawSocket, data: bytes) -> tuple[int | None, list[dict[str, Any]]]:
    """Send ``data`` then a ping; read to the pong (None) or the close (its code)."""
    with contextlib.suppress(trio.BrokenResourceError):  # closed already: what it sent is still read
        await raw.send_frame(data + _PING)
    got: list[dict[str, Any]] = []
    while True:
        try:
            message = await raw.receive(timeout=20)
        except EOFError:
            raise Violation(f"TCP ended with no close frame, after {[m.get('type') for m in got]}") from None
        except trio.TooSlowError:
            raise Violation(
                f"neither a pong nor a close in 20 s, after {[m.get('type') for m in got]}"
            ) from None
        if isinstance(message, tuple):
            code, reason = message
            if code not in DOCUMENTED_CLOSES:
                raise Violation(f"closed {code} ({reason!r}), not a documented code")
            return code, got
        if isinstance(message, bytes):
            continue
        if message == {"type": "pong"}:
            return None, got
        _check_frame(message)
        got.append(message)


async def check_frame(target: AgentSocket, case: Frame) -> None:
    """Send ``case`` on a new socket and check what must hold; raise :class:`Violation` if not."""
    TALLY[case.verb] += 1
    async with target.client(target.token) as client:
        created = await client.post("/v1/agent/sessions", json={})
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        async with open_raw_socket(target.addresses.public, case.target(session_id)) as raw:
            if case.authenticated:
                await raw.auth(target.token, session_id)
            code, got = await _exchange(raw, case.bound(target.token, session_id))
            errors = sorted({f"error {m['code']}" for m in got if m["type"] == "error"})
            ANSWERS[case.verb, " + ".join([*errors, "pong" if code is None else f"close {code}"])] += 1
            if code is None:
                # It lives: close it as a client should, and it must answer the close.
                await raw.send_frame(ws_frame(CLOSE, struct.pack("!H", 1000)))
                try:
                    await raw.closed(timeout=10)
                except (EOFError, trio.TooSlowError):
                    raise Violation("a close from the client was not answered with a close") from None
        refused = code in REFUSING_CLOSES or (
            any(m["type"] == "error" for m in got) and not any(m["type"] == "turn.start" for m in got)
        )
        if refused:
            stored = await client.get(f"/v1/agent/sessions/{session_id}/messages")
            if stored.status_code != 200 or stored.json()["messages"]:
                raise Violation(f"refused (closed {code}) but the conversation kept {stored.text[:300]}")


async def check_healthy(target: AgentSocket) -> None:
    """After the storm: /health, and a new conversation takes a typed turn to its end."""
    await check_health(target.addresses)
    async with target.client(target.token) as client:
        created = await client.post("/v1/agent/sessions", json={})
        session_id = created.json()["session_id"]
    await take_turn(target.addresses.public, target.token, session_id)


async def check_health(addresses: Addresses) -> None:
    """The runner answers ``/health``."""
    async with httpx.AsyncClient(timeout=20) as plain:
        health = await plain.get(f"http://{addresses.management}/health")
    if health.status_code != 200:
        raise Violation(f"/health answered {health.status_code}")


async def take_turn(public: str, token: str, session_id: str) -> None:
    """A typed turn on a new socket of the conversation, to its ``turn.done``."""
    async with open_raw_socket(public, f"/v1/agent/stream?session_id={session_id}") as raw:
        await raw.auth(token, session_id)
        await raw.send_json({"type": "user_message", "text": "When is breakfast served?"})
        kinds: list[str] = []
        with trio.fail_after(30):
            while not kinds or kinds[-1] not in ("turn.done", "interrupted"):
                message = await raw.receive()
                if isinstance(message, dict):
                    _check_frame(message)
                    kinds.append(message["type"])
                elif isinstance(message, tuple):
                    raise Violation(f"a normal turn was closed {message}")
        if kinds[-1] != "turn.done":
            raise Violation(f"a normal turn ended {kinds}")
