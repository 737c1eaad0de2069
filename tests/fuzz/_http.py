"""The management API under generated requests: what each route is sent, and what must hold.

For every request, whatever it holds: an answer (never a dropped connection), never a 500,
an ErrorBody with a documented code and its status for every refusal, a 2xx body of the
route's schema, 401 before anything else without the token, nothing journaled for the ids
a refused request named (but the refusals documented to be recorded), and the runner still
answering. After a route's examples: ``/health``, a call that starts and stops, the events
stream reading its records.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import attrs
import httpx
import jsonschema
import trio
from hypothesis import strategies as st

from ..faults._raw import read_answer
from ..runner_process import TOKEN, open_events, records
from ._cases import PROTOCOL, Body, bodies, query_values, segments, valid

LIVE = "fuzz-live"
"""A call the module's runner holds all along: messages, settings and reads go to it."""
VICTIM = "fuzz-victim"
"""A call a DELETE may stop; started again before each DELETE example."""

GOOD_AUTH = (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER  {TOKEN} ")
BAD_AUTH = (None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer", f"Bearer {TOKEN}x", f"{TOKEN}")

# The seed's error codes, each with the status it is answered with (docs/host-protocol.md:
# a known path with another method is 405 not_found).
STATUS_OF = {
    "unauthorized": {401},
    "unknown_version": {404},
    "not_found": {404, 405},
    "invalid_request": {400, 413},
    "session_not_found": {404},
    "runner_at_capacity": {409},
    "generation_mismatch": {409},
    "runner_draining": {503},
    "start_failed": {502},
    "runner_takes_no_calls": {501},
    "cursor_too_old": {410},
    "no_journal": {404},
    "no_handler": {422},
    "invalid_payload": {422},
    "handler_failed": {422},
    "not_adjustable": {403},
    "invalid_settings": {422},
}
# Refusals that still write records, as documented (docs/operations.md): a call that could not
# start is closed in its record (curb.started, then curb.ended with the cause); the agent's own
# refusal of a message or a settings change is that attempt's outcome in the call's record
# (curb.message, curb.settings), like every message and change the call was given.
RECORDED_REFUSALS = {"start_failed"}
AGENT_REFUSALS = {"no_handler", "invalid_payload", "handler_failed", "not_adjustable", "invalid_settings"}

_VALIDATORS = {
    name: jsonschema.Draft202012Validator({"$defs": PROTOCOL["$defs"], "$ref": f"#/$defs/{name}"})
    for name in (
        "Health",
        "ErrorBody",
        "RunnerStatus",
        "StartCallResponse",
        "LiveCall",
        "StopCallResponse",
        "HostMessageAccepted",
        "SessionSettingsResponse",
    )
}


class Violation(AssertionError):
    """Something that must hold for every request did not."""


@attrs.frozen
class Request:
    """One request as sent: the route it exercises, and its method, target, headers and body."""

    route: str
    method: str
    target: str
    auth: str | None
    content_type: str | None
    body: Body | None
    names: tuple[str, ...] = ()  # the session ids it names: none of them may gain a record if refused

    def encode(self, host: str) -> bytes:
        data = self.body.data if self.body is not None else b""
        head = f"{self.method} {self.target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
        if self.auth is not None:
            head += f"Authorization: {self.auth}\r\n"
        if self.content_type is not None:
            head += f"Content-Type: {self.content_type}\r\n"
        if self.body is not None:
            head += f"Content-Length: {len(data)}\r\n"
        return head.encode("latin-1") + b"\r\n" + data


@attrs.frozen
class Route:
    name: str
    method: str
    answers: str | None  # the schema of its 2xx body; None: not JSON (a stream, metrics)


ROUTES = {
    r.name: r
    for r in (
        Route("GET /health", "GET", "Health"),
        Route("GET /v1/runner", "GET", "RunnerStatus"),
        Route("POST /v1/runner/drain", "POST", "RunnerStatus"),
        Route("GET /v1/runner/events", "GET", None),
        Route("GET /v1/metrics", "GET", None),
        Route("POST /v1/sessions", "POST", "StartCallResponse"),
        Route("GET /v1/sessions/{id}", "GET", "LiveCall"),
        Route("DELETE /v1/sessions/{id}", "DELETE", "StopCallResponse"),
        Route("POST /v1/sessions/{id}/messages", "POST", "HostMessageAccepted"),
        Route("PATCH /v1/sessions/{id}", "PATCH", "SessionSettingsResponse"),
        Route("a path under no route", "GET", None),
    )
}

_CONTENT_TYPES = ("application/json",) * 4 + (
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "application/json; charset=latin-1",
    "multipart/form-data; boundary=x",
)
_OTHER_METHODS = ("PUT", "HEAD", "OPTIONS", "TRACE", "CONNECT", "FOO")
# Mostly ids of the documented alphabet (docs/host-protocol.md), so that valid starts start calls.
_SESSION_IDS = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:@+=~-]{0,30}\Z") | st.text(min_size=1)
_REALTIME_URLS = st.sampled_from(["loopback:", "loopback://x?fail=refused", "nowhere:", "no scheme at all"])


def _name_of(segment: str) -> str:
    return unquote_to_bytes(segment).decode("utf-8", "replace")


@st.composite
def requests(draw: st.DrawFn, route_name: str) -> Request:
    """A request to ``route_name``: valid, or broken in its auth, method, path, query or body."""
    route = ROUTES[route_name]
    auths = (
        st.sampled_from(BAD_AUTH)
        if route_name == "POST /v1/runner/drain"
        else st.sampled_from(GOOD_AUTH * 6 + BAD_AUTH)
    )
    auth = draw(auths)
    method = draw(st.sampled_from((route.method,) * 24 + _OTHER_METHODS))
    body: Body | None = None
    names: tuple[str, ...] = ()
    content_type = draw(st.sampled_from(_CONTENT_TYPES))
    if route_name == "GET /v1/runner/events":
        target = "/v1/runner/events" + draw(
            st.sampled_from(["", "?from="]) | query_values().map(lambda q: "?from=" + q)
        )
    elif route_name == "a path under no route":
        target = (
            "/"
            + draw(st.sampled_from(["v1/", "v2/", "", "v1/sessions/a/b/c", "health/x"]))
            + draw(segments())
        )
    elif "{id}" in route_name:
        segment = draw(segments(LIVE, VICTIM) if route.method != "DELETE" else segments(VICTIM))
        names = (_name_of(segment),)
        target = route_name.split(" ", 1)[1].replace("{id}", segment)
        if route.method == "DELETE":
            query = draw(
                st.fixed_dictionaries({}, optional={"graceMs": query_values(), "reason": query_values()})
            )
            target += ("?" + "&".join(f"{k}={v}" for k, v in query.items())) if query else ""
        elif route.method == "POST":
            body = draw(bodies(valid(PROTOCOL, "HostMessage", name=_MESSAGE_NAMES)))
        elif route.method == "PATCH":
            body = draw(bodies(valid(PROTOCOL, "SessionUpdate")))
    elif route_name == "POST /v1/sessions":
        body = draw(
            bodies(valid(PROTOCOL, "StartCallRequest", realtimeUrl=_REALTIME_URLS, sessionId=_SESSION_IDS))
        )
        target = "/v1/sessions"
    else:
        target = route_name.split(" ", 1)[1]
        if draw(st.booleans()):
            body = draw(bodies(st.just({"drain": True})))
    if body is not None and route_name == "POST /v1/sessions":
        names = tuple(n for n in (_session_id_in(body.data),) if n)
    return Request(route_name, method, target, auth, content_type if body is not None else None, body, names)


# A message to an agent handler that exists (tests.agents:messenger), one that does not, or any
# name the schema allows; never "ask", which waits for the host's answer for up to its timeout.
_MESSAGE_NAMES = st.sampled_from(
    ["note", "lead", "flaky", "relay", "human.decision", "nobody.listens"]
) | st.text(min_size=1, max_size=256).filter(lambda n: n != "ask")


def _session_id_in(data: bytes) -> str | None:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    session_id = value.get("sessionId") if isinstance(value, dict) else None
    return session_id if isinstance(session_id, str) else None


# -- Checking ------------------------------------------------------------------------------------

RUNNER_AGENT = "tests.agents:messenger"
RUNNER_ARGS = ("--max-sessions", "64", "--drain-grace-ms", "100")

TALLY: Counter[str] = Counter()
"""Requests checked, by route (``python -m bench.fuzz`` prints it)."""
ANSWERS: Counter[tuple[str, str]] = Counter()
"""What they were answered, by route: ``"202"``, ``"400 invalid_request"``, ..."""


@attrs.define
class Management:
    """The management listener of the runner under test."""

    address: str

    def client(self, timeout: float = 20) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://{self.address}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout
        )


async def prepare(target: Management) -> None:
    """Start the call that messages, settings and reads go to."""
    async with target.client() as client:
        started = await client.post("/v1/sessions", json=_start(LIVE))
    assert started.status_code == 202, started.text


async def journal_head(client: httpx.AsyncClient) -> int:
    metrics = await client.get("/v1/metrics")
    found = re.search(r"^curb_journal_head_envelope (\S+)$", metrics.text, re.M)
    assert metrics.status_code == 200 and found, metrics.text[:200]
    return int(float(found.group(1)))


async def records_between(target: Management, after: int, upto: int) -> list[dict[str, Any]]:
    """The journal's records with envelopes in ``(after, upto]``, from the events stream."""
    if upto <= after:
        return []
    with trio.fail_after(10):
        async with open_events(target, f"from={after}") as events:
            lines = await events.lines(until=lambda got: got[-1].get("envelope", 0) >= upto)
    return records(lines)


async def exchange(address: str, request: Request) -> tuple[int, dict[str, str], bytes]:
    host, port = address.rsplit(":", 1)
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            # Answered and closed before the whole body was sent: the answer is still read.
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(request.encode(address))
            try:
                return await read_answer(stream)
            except (EOFError, trio.BrokenResourceError) as exc:
                raise Violation(f"no answer: {exc}") from None


def _check_answer(request: Request, status: int, headers: dict[str, str], body: bytes) -> str | None:
    """The ErrorBody code of a refusal, None for a 2xx; Violation for anything undocumented."""
    route = ROUTES[request.route]
    if status == 500 or status not in {200, 202} | set().union(*STATUS_OF.values()):
        raise Violation(f"status {status}: {body[:300]!r}")
    if request.method == "HEAD":
        return None if status < 300 else "(head)"
    if status < 300:
        if request.method == "OPTIONS":
            return None
        if request.route != "GET /health" and request.auth not in GOOD_AUTH:
            raise Violation(f"{status} without the token")
        if route.answers is not None:
            _validate(route.answers, body)
        elif request.route == "GET /v1/runner/events" and "application/x-ndjson" not in headers.get(
            "content-type", ""
        ):
            raise Violation(f"the events stream answered {headers.get('content-type')}")
        return None
    try:
        error = json.loads(body)
    except ValueError:
        raise Violation(f"{status} with a body that is not JSON: {body[:200]!r}") from None
    _validate("ErrorBody", body)
    code = error["error"]
    if status not in STATUS_OF.get(code, ()):
        raise Violation(f"{code} answered with status {status}")
    if request.route != "GET /health" and request.auth not in GOOD_AUTH and code != "unauthorized":
        raise Violation(f"{code} ({status}) without the token: auth must be checked first")
    return str(code)


def _validate(schema: str, body: bytes) -> None:
    try:
        value = json.loads(body)
    except ValueError:
        raise Violation(f"a {schema} that is not JSON: {body[:200]!r}") from None
    errors = list(_VALIDATORS[schema].iter_errors(value))
    if errors:
        raise Violation(f"not a {schema}: {errors[0].message} in {body[:300]!r}")


async def check_request(target: Management, request: Request) -> None:
    """Send ``request`` and check what must hold; raise :class:`Violation` if it did not."""
    TALLY[request.route] += 1
    async with target.client() as client:
        if request.route == "DELETE /v1/sessions/{id}":
            await client.post("/v1/sessions", json=_start(VICTIM))
        before = await journal_head(client)
        status, headers, body = await exchange(target.address, request)
        refused = _check_answer(request, status, headers, body)
        ANSWERS[request.route, f"{status} {refused or ''}".strip()] += 1
        after = await journal_head(client)
        if refused is not None and refused not in RECORDED_REFUSALS and request.names:
            written = [
                r for r in await records_between(target, before, after) if r["producer"] in request.names
            ]
            if refused in AGENT_REFUSALS:
                written = [r for r in written if (r["body"].get("payload") or {}).get("outcome") != refused]
            if written:
                raise Violation(f"refused {refused} ({status}) but journaled {written[:2]}")
        if status == 202 and request.route == "POST /v1/sessions" and request.names:
            # Accepted: stop it again, so that the runner never fills up.
            name = request.names[0]
            if name not in (LIVE, VICTIM):
                stopped = await client.delete(f"/v1/sessions/{_quote(name)}")
                if stopped.status_code != 200:
                    raise Violation(f"a call it started does not stop: {stopped.status_code} {stopped.text}")


def _quote(name: str) -> str:
    return quote(name, safe="")


def _start(session_id: str) -> dict[str, str]:
    return {"sessionId": session_id, "realtimeUrl": "loopback:", "realtimeToken": "t"}


async def check_healthy(target: Management, run: int) -> None:
    """The runner after the storm: /health, a call that starts and stops, the stream reads it."""
    async with target.client() as client:
        health = await client.get("/health")
        if health.status_code != 200:
            raise Violation(f"/health answered {health.status_code}")
        before = await journal_head(client)
        name = f"fuzz-health-{run}"
        started = await client.post("/v1/sessions", json=_start(name))
        if started.status_code != 202 or started.json()["call"]["state"] != "connected":
            raise Violation(f"a normal start answered {started.status_code} {started.text}")
        stopped = await client.delete(f"/v1/sessions/{name}")
        if stopped.status_code != 200 or stopped.json() != {"sessionId": name, "stopped": True}:
            raise Violation(f"a normal stop answered {stopped.status_code} {stopped.text}")
        written = await records_between(target, before, await journal_head(client))
        events = [r["body"].get("name") for r in written if r["producer"] == name]
        if events[:1] != ["curb.started"] or events[-1:] != ["curb.ended"]:
            raise Violation(f"the stream did not read the call: {events}")
