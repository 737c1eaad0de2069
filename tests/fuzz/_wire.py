"""Attacks on the HTTP and WebSocket layer itself, below any route (issue 27): what each sends, what must hold.

- ``smuggling``: a request whose framing two readers could take differently (Content-Length
  and Transfer-Encoding together, a coding list, a folded or spaced header, two lengths, bare
  LF, HTTP/1.0 with chunked, an overflowing chunk size), with a marked request after the end
  one of the framings sees. Must hold: the marked request is never answered, every answer is
  HTTP/1.1 with an ErrorBody when it is not 2xx, and a refusal closes the connection.
- ``head``: ``HEAD`` on every route of both listeners, with and without a credential, then
  another request on the same connection. Must hold: the answer is a head with no body, and
  the next request is answered.
- ``first frame``: the agent socket's first message before ``auth``: oversized, nested,
  compressed (permessage-deflate's bit), fragmented, audio. Must hold: the socket closes
  with a documented code (never a pong, never 4013), and ``/health`` answers within
  :data:`HEALTH_DEADLINE_S` all along.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import zlib
from collections import Counter
from typing import Any

import attrs
import httpx
import trio
from hypothesis import strategies as st

from ..faults._raw import BINARY, TEXT, frame_head, open_raw_socket
from ..runner_process import TOKEN
from ..websocket.ino_client import API_KEY, Addresses
from ._http import Violation
from ._socket import DOCUMENTED_CLOSES

ATTACKS = ("smuggling", "head", "first frame")
HEALTH_DEADLINE_S = 10.0
"""How long ``/health`` may take while an attack runs (generous: it answers in milliseconds;
before, one first frame held it for 12 s and more)."""
HEALTH_MS: list[float] = []
"""How long each ``/health`` asked during a first-frame attack took (``python -m bench.fuzz`` prints the worst)."""

TALLY: Counter[str] = Counter()
"""Attacks checked, by family (``python -m bench.fuzz`` prints it)."""
ANSWERS: Counter[tuple[str, str]] = Counter()
"""How each was answered, by family: ``"400 invalid_request"``, ``"close 4001"``, ..."""

MiB = 1 << 20


@attrs.define
class Wire:
    """Both listeners of the runner under test."""

    addresses: Addresses

    def address(self, listener: str) -> str:
        return self.addresses.management if listener == "management" else self.addresses.public

    @staticmethod
    def credential(listener: str) -> str:
        return TOKEN if listener == "management" else API_KEY


# -- Smuggling ---------------------------------------------------------------------------------

_LF = "\r\n"
# Each: the framing lines, given the length of what follows the head, and what follows it (a
# chunked end, so that a reader of chunked sees the marked request next, one of the length
# sees it inside the body).
_CHUNKED_END = "0\r\n\r\n"
SHAPES: dict[str, tuple[list[str], str]] = {
    "CL then TE": (["Content-Length: {n}", "Transfer-Encoding: {te}"], _CHUNKED_END),
    "TE then CL": (["Transfer-Encoding: {te}", "Content-Length: {n}"], _CHUNKED_END),
    "TE twice and CL": (
        ["Transfer-Encoding: {te}", "Transfer-Encoding: identity", "Content-Length: {n}"],
        _CHUNKED_END,
    ),
    "TE folded and CL": (["Transfer-Encoding:", " {te}", "Content-Length: {n}"], _CHUNKED_END),
    "TE spaced and CL": (["Transfer-Encoding : {te}", "Content-Length: {n}"], _CHUNKED_END),
    "two lengths": (["Content-Length: 0", "Content-Length: {n}"], ""),
    "an odd length": (["Content-Length: {odd}"], ""),
    "TE alone, odd": (["Transfer-Encoding: {odd_te}"], _CHUNKED_END),
    "an overflowing chunk": (["Transfer-Encoding: chunked"], "f" * 24 + "\r\nab\r\n0\r\n\r\n"),
    # One framing only: if the chunk end is read, the marked request is a pipelined one and may run.
    "a chunk end with bare LF": (["Transfer-Encoding: chunked"], "0\n\n"),
}
_PIPELINED = {"a chunk end with bare LF"}
_ODD_TE = ("chunked, identity", "identity, chunked", "gzip, chunked", "xchunked", "chunked;q=1", "chunk")
_TE_VALUES = ("chunked", "Chunked", " chunked", "chunked ", "\tchunked", *_ODD_TE)
_ODD_LENGTHS = ("+{n}", " {n} ", "{n}, {n}", "0{n}", "{n}.0", "0x{n}", "-{n}", "{n} {n}")
_TARGETS = {
    "management": (("GET", "/health"), ("GET", "/v1/runner"), ("POST", "/v1/runner/nowhere")),
    "public": (("POST", "/v1/ephemeral-keys"), ("GET", "/v1/agent/relations"), ("GET", "/nowhere")),
}


@attrs.frozen
class Smuggled:
    listener: str
    shape: str
    request: bytes
    mark: str

    def __repr__(self) -> str:
        return f"Smuggled({self.listener}, {self.shape}, {self.request[:400]!r})"


@st.composite
def smuggling(draw: st.DrawFn) -> Smuggled:
    listener = draw(st.sampled_from(sorted(_TARGETS)))
    method, path = draw(st.sampled_from(_TARGETS[listener]))
    shape = draw(st.sampled_from(sorted(SHAPES)))
    lines, body = SHAPES[shape]
    mark = f"/v1/smuggled-{secrets.token_hex(4)}"
    smuggled = (
        f"GET {mark} HTTP/1.1{_LF}Host: x{_LF}Authorization: Bearer {Wire.credential(listener)}{_LF}{_LF}"
    )
    rest = body + smuggled
    version = draw(st.sampled_from(("HTTP/1.1",) * 5 + ("HTTP/1.0",)))
    ending = draw(st.sampled_from((_LF,) * 5 + ("\n",)))
    framing = [
        line.format(
            n=len(rest),
            te=draw(st.sampled_from(_TE_VALUES)),
            odd_te=draw(st.sampled_from(_ODD_TE)),
            odd=draw(st.sampled_from(_ODD_LENGTHS)),
        )
        for line in lines
    ]
    framing = [line.replace("{n}", str(len(rest))) for line in framing]
    head = [
        f"{method} {path} {version}",
        "Host: x",
        f"Authorization: Bearer {Wire.credential(listener)}",
        *framing,
    ]
    request = (ending.join(head) + ending + ending + rest).encode("latin-1")
    return Smuggled(listener, shape, request, mark)


async def _answers(stream: trio.SocketStream) -> list[tuple[int, dict[str, str], bytes]]:
    """Every answer on the connection until it closes or stays quiet for 3 s."""
    buffer, answers = b"", []
    while True:
        with trio.move_on_after(3) as quiet:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
        if quiet.cancelled_caught or not data:
            break
        buffer += data
        while b"\r\n\r\n" in buffer:
            head, rest = buffer.split(b"\r\n\r\n", 1)
            status_line, *lines = head.decode("latin-1").split("\r\n")
            if not status_line.startswith("HTTP/1.1 "):
                raise Violation(f"an answer that is not HTTP/1.1: {buffer[:200]!r}")
            headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
            size = int(headers.get("content-length", "0"))
            if len(rest) < size:
                break
            answers.append((int(status_line.split()[1]), headers, rest[:size]))
            buffer = rest[size:]
    return answers


def _error_code(status: int, body: bytes) -> str:
    if status == 500:
        raise Violation(f"500: {body[:200]!r}")
    if status < 300:
        return ""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        raise Violation(f"{status} with no ErrorBody: {body[:200]!r}") from None
    return f" {error}"


async def check_smuggling(target: Wire, case: Smuggled) -> None:
    host, port = target.address(case.listener).rsplit(":", 1)
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(case.request)
            answers = await _answers(stream)
    if not answers:
        raise Violation("no answer")
    for status, _, body in answers:
        _error_code(status, body)
        if case.mark.encode() in body and case.shape not in _PIPELINED:
            raise Violation(f"the smuggled request was answered ({status}): {body[:200]!r}")
    status, _, body = answers[0]
    if status >= 400 and len(answers) > 1:
        raise Violation(f"refused {status} but went on answering: {[a[0] for a in answers]}")
    ANSWERS["smuggling", f"{status}{_error_code(status, body)}"] += 1


# -- HEAD on every route -----------------------------------------------------------------------

HEAD_ROUTES = {
    "management": (
        "/health",
        "/v1/runner",
        "/v1/runner/events",
        "/v1/runner/events?from=0",
        "/v1/metrics",
        "/v1/sessions",
        "/v1/sessions/fuzz-none",
        "/v1/sessions/fuzz-none/messages",
        "/v1/runner/drain",
        "/v2/x",
        "/v1/nowhere",
    ),
    "public": (
        "/v1/ephemeral-keys",
        "/v1/ephemeral-keys/x/revoke",
        "/v1/agent/sessions",
        "/v1/agent/sessions/x/messages",
        "/v1/agent/sessions/x/compact",
        "/v1/agent/sessions/x",
        "/v1/agent/relations",
        "/v1/agent/stream",
        "/",
        "/nowhere",
    ),
}


@attrs.frozen
class Head:
    listener: str
    target: str
    authenticated: bool


@st.composite
def heads(draw: st.DrawFn) -> Head:
    listener = draw(st.sampled_from(sorted(HEAD_ROUTES)))
    return Head(listener, draw(st.sampled_from(HEAD_ROUTES[listener])), draw(st.booleans()))


async def check_head(target: Wire, case: Head) -> None:
    host, port = target.address(case.listener).rsplit(":", 1)
    auth = f"Authorization: Bearer {Wire.credential(case.listener)}\r\n" if case.authenticated else ""
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"HEAD {case.target} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        buffer = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    raise Violation("the connection closed before the head")
                buffer += data
        if b"\r\n\r\n" not in buffer:
            raise Violation("no answer to HEAD in 10 s")
        head, rest = buffer.split(b"\r\n\r\n", 1)
        status = int(head.split()[1])
        if status >= 500:
            raise Violation(f"HEAD answered {status}")
        if rest:
            raise Violation(f"HEAD answered with a body: {rest[:100]!r}")
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        with trio.move_on_after(10) as late:
            while b"HTTP/1.1 " not in rest:
                data = await stream.receive_some(65536)
                if not data:
                    break
                rest += data
        if late.cancelled_caught or not rest.startswith(b"HTTP/1.1 "):
            raise Violation(f"the request after HEAD got no answer: {rest[:100]!r}")
    ANSWERS["head", str(status)] += 1


# -- The first frame before auth ---------------------------------------------------------------


@attrs.frozen
class FirstFrame:
    kind: str
    size: int
    compressed: bool
    fragments: int

    def payload(self) -> bytes:
        if self.kind == "nested lists":
            return b"[" + b"[]," * max(0, self.size // 3 - 1) + b"[]]"
        if self.kind == "deep":
            half = max(1, self.size // 2)
            return b"[" * half + b"]" * half
        if self.kind == "padded auth":
            pad = max(0, self.size - 48)
            return b'{"type":"auth","key":"' + b"k" * pad + b'","session_id":"x"}'
        return bytes(self.size)  # audio, or zeros as text

    def frames(self) -> bytes:
        """The message as masked frames (an all-zero mask: the payload goes as is)."""
        data = self.payload()
        if self.compressed:
            squeeze = zlib.compressobj(wbits=-15)
            data = squeeze.compress(data) + squeeze.flush(zlib.Z_SYNC_FLUSH)[:-4]
        opcode = BINARY if self.kind == "audio" else TEXT
        step = max(1, -(-len(data) // self.fragments))
        pieces = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
        out = []
        for n, piece in enumerate(pieces):
            first, last = n == 0, n == len(pieces) - 1
            rsv = 0b100 if first and self.compressed else 0
            out.append(frame_head(opcode if first else 0, len(piece), fin=last, rsv=rsv) + piece)
        return b"".join(out)


@st.composite
def first_frames(draw: st.DrawFn) -> FirstFrame:
    return FirstFrame(
        kind=draw(st.sampled_from(("nested lists", "deep", "padded auth", "audio", "zeros"))),
        size=draw(st.sampled_from((1 << 10, 60 << 10, (64 << 10) + 1, MiB, 16 * MiB - 64, 16 * MiB + 1))),
        compressed=draw(st.booleans()),
        fragments=draw(st.sampled_from((1, 1, 2, 7, 64))),
    )


async def _health_holds(addresses: Addresses, done: trio.Event) -> None:
    async with httpx.AsyncClient(timeout=HEALTH_DEADLINE_S * 4) as client:
        while not done.is_set():
            asked = trio.current_time()
            with trio.move_on_after(HEALTH_DEADLINE_S) as late:
                answer = await client.get(f"http://{addresses.management}/health")
            HEALTH_MS.append((trio.current_time() - asked) * 1000)
            if late.cancelled_caught:
                raise Violation(f"/health gave no answer in {HEALTH_DEADLINE_S:g} s during the attack")
            if answer.status_code != 200:
                raise Violation(f"/health answered {answer.status_code} during the attack")
            await trio.sleep(0.1)


async def check_first_frame(target: Wire, case: FirstFrame) -> None:
    done = trio.Event()
    code: list[int] = []

    async def attack() -> None:
        try:
            async with open_raw_socket(target.addresses.public, "/v1/agent/stream?session_id=x") as raw:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await raw.send_frame(case.frames() + frame_head(TEXT, 15) + b'{"type":"ping"}')
                try:
                    got = await raw.receive(timeout=20)
                except EOFError:
                    raise Violation("TCP ended with no close frame") from None
                except trio.TooSlowError:
                    raise Violation("no close in 20 s") from None
                if not isinstance(got, tuple):
                    raise Violation(f"answered {str(got)[:100]} before auth, not closed")
                if got[0] not in DOCUMENTED_CLOSES:
                    raise Violation(f"closed {got[0]} ({got[1]!r}), not a documented code")
                code.append(got[0])
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_health_holds, target.addresses, done)
        await attack()
    ANSWERS["first frame", f"close {code[0]}"] += 1


# -- The families --------------------------------------------------------------------------------


def attacks(name: str) -> st.SearchStrategy[Any]:
    return {"smuggling": smuggling(), "head": heads(), "first frame": first_frames()}[name]


async def check_attack(target: Wire, case: Any) -> None:
    """Send ``case`` and check what must hold; raise :class:`Violation` if it did not."""
    if isinstance(case, Smuggled):
        TALLY["smuggling"] += 1
        await check_smuggling(target, case)
    elif isinstance(case, Head):
        TALLY["head"] += 1
        await check_head(target, case)
    else:
        TALLY["first frame"] += 1
        await check_first_frame(target, case)


async def followers(addresses: Addresses) -> int:
    async with httpx.AsyncClient(timeout=20, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        metrics = (await client.get(f"http://{addresses.management}/v1/metrics")).text
    line = next(line for line in metrics.splitlines() if line.startswith("curb_stream_followers "))
    return int(float(line.split()[1]))


async def check_healthy(target: Wire) -> None:
    """After the attacks: /health, no events follower left behind, and a real auth still passes."""
    with trio.move_on_after(10):
        while await followers(target.addresses):
            await trio.sleep(0.2)
    left = await followers(target.addresses)
    if left:
        raise Violation(f"{left} events followers held after their clients left")
    async with httpx.AsyncClient(timeout=20) as client:
        health = await client.get(f"http://{target.addresses.management}/health")
        if health.status_code != 200:
            raise Violation(f"/health answered {health.status_code}")
        headers = {"Authorization": f"Bearer {API_KEY}"}
        minted = await client.post(
            f"http://{target.addresses.public}/v1/ephemeral-keys",
            json={"end_user_id": "wire"},
            headers=headers,
        )
        token = minted.json()["token"]
        session = await client.post(
            f"http://{target.addresses.public}/v1/agent/sessions",
            json={},
            headers={"Authorization": f"Bearer {token}"},
        )
        session_id = session.json()["session_id"]
    async with open_raw_socket(target.addresses.public, f"/v1/agent/stream?session_id={session_id}") as raw:
        await raw.auth(token, session_id)
