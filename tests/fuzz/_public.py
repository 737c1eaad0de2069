"""The public listener's REST routes under generated requests: what each route is sent, what must hold.

The routes the agent socket needs (docs/agent-websocket.md): minting and revoking ephemeral
keys with the API key, and a person's conversations and relations with their token (or the
API key). For every request, whatever it holds: an answer (never a dropped connection),
never a 500, every refusal an ErrorBody with a seed code and that code's status, a 2xx body
of the route's ``rest.*`` schema in ``runner/ino.schema.json`` and only for a credential the
route takes, 401 for a routed request whose credential it does not take, and nothing in the
runner's file changed by a refused request. After the examples: ``/health``, a new
conversation that takes a turn.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import attrs
import httpx
import jsonschema
import trio
from hypothesis import strategies as st

from ..runner_process import TOKEN as MANAGEMENT_TOKEN
from ..websocket.ino_client import API_KEY, Addresses
from ._cases import INO, PROTOCOL, bodies, segments, valid
from ._http import Request, Violation, exchange
from ._socket import check_health, take_turn

# Marks in a drawn request, bound to this runner's credentials and ids when it is sent.
KEY, TOKEN, OTHER, REVOKED, EXPIRED = "@key@", "@token@", "@other@", "@revoked@", "@expired@"
LIVE, OTHERS, GONE, VICTIM = "@live@", "@others@", "@gone@", "@victim@"
VICTIM_KEY = "@victim-key@"

# The codes a refusal may carry here (seed 000's ErrorBody codes, seed 002's REST codes), each
# with its status (a known path with another method is 405 not_found, as on the management API).
STATUS_OF = {
    "unauthorized": {401},
    "not_found": {404, 405},
    "invalid_request": {400, 413},
    "conflict": {409},
}
_ERROR_BODY = jsonschema.Draft202012Validator({"$defs": PROTOCOL["$defs"], "$ref": "#/$defs/ErrorBody"})


@attrs.frozen
class Route:
    name: str
    method: str
    answers: str | None  # the rest.* schema of its 2xx body; None: no route
    takes: frozenset[str]  # the credentials it takes: KEY, TOKEN (a person's)


_KEY_ONLY, _TOKEN_ONLY, _EITHER = frozenset({KEY}), frozenset({TOKEN}), frozenset({KEY, TOKEN})
ROUTES = {
    r.name: r
    for r in (
        Route("POST /v1/ephemeral-keys", "POST", "rest.EphemeralKey", _KEY_ONLY),
        Route("POST /v1/ephemeral-keys/{token_id}/revoke", "POST", "rest.Revoked", _KEY_ONLY),
        Route("POST /v1/agent/sessions", "POST", "rest.AgentSession", _TOKEN_ONLY),
        Route("GET /v1/agent/sessions/{id}/messages", "GET", "rest.AgentSessionMessages", _EITHER),
        Route("POST /v1/agent/sessions/{id}/compact", "POST", "rest.CompactionDone", _EITHER),
        Route("DELETE /v1/agent/sessions/{id}", "DELETE", "rest.Deleted", _EITHER),
        Route("GET /v1/agent/relations", "GET", "rest.Relations", _EITHER),
        Route("a path under no route", "GET", None, frozenset()),
    )
}
_VALIDATORS = {
    name: jsonschema.Draft202012Validator(
        {"$defs": INO["$defs"], "$ref": f"#/$defs/{name}"}, format_checker=jsonschema.FormatChecker()
    )
    for name in {r.answers for r in ROUTES.values() if r.answers is not None}
}

# The API key and the person's token (or another person's), as a client may write them; then
# credentials no route takes.
_KEY_HEADERS = (f"Bearer {KEY}", f"bearer {KEY}")
_TOKEN_HEADERS = (f"Bearer {TOKEN}", f"BEARER  {TOKEN} ", f"Bearer {OTHER}")
_BAD = (
    None,
    "Bearer wrong-credential",
    f"Basic {KEY}",
    "Bearer",
    f"Bearer {KEY}x",
    f"Bearer {TOKEN}x",
    KEY,
    f"Bearer {REVOKED}",
    f"Bearer {EXPIRED}",
    "Bearer ek_0000000000000000_x",
)
_CONTENT_TYPES = ("application/json",) * 4 + (None, "text/plain", "multipart/form-data; boundary=x")
_OTHER_METHODS = ("PUT", "PATCH", "HEAD", "OPTIONS", "FOO")
_HEX16 = st.from_regex(r"\A[0-9a-f]{16}\Z")


def _credential(auth: str | None) -> str | None:
    """Which credential a drawn Authorization header carries (KEY, TOKEN, OTHER), None for none."""
    if auth is None:
        return None
    scheme, _, rest = auth.strip().partition(" ")
    given = rest.strip()
    if scheme.lower() != "bearer":
        return None
    return {KEY: KEY, TOKEN: TOKEN, OTHER: TOKEN}.get(given)


@st.composite
def requests(draw: st.DrawFn, route_name: str) -> Request:
    """A request to ``route_name``: valid, or broken in its credential, method, path or body."""
    route = ROUTES[route_name]
    # Mostly a credential the route takes, so that most requests get past it to what is checked next.
    own = (_KEY_HEADERS if KEY in route.takes else ()) + (_TOKEN_HEADERS if TOKEN in route.takes else ())
    auth = draw(st.sampled_from(own * 4 + _KEY_HEADERS + _TOKEN_HEADERS + _BAD))
    method = draw(st.sampled_from((route.method,) * 16 + _OTHER_METHODS))
    body = None
    target = route_name.split(" ", 1)[1]
    names: tuple[str, ...] = ()
    if route_name == "POST /v1/ephemeral-keys":
        body = draw(bodies(valid(INO, "rest.EphemeralKeyRequest")))
    elif route_name == "POST /v1/ephemeral-keys/{token_id}/revoke":
        names = (draw(st.sampled_from([VICTIM_KEY] * 4) | _HEX16 | segments()),)
        target = target.replace("{token_id}", names[0])
    elif "{id}" in route_name:
        known = (VICTIM,) * 4 if route.method == "DELETE" else (LIVE,) * 4
        names = (draw(st.sampled_from((*known, OTHERS, GONE)) | segments()),)
        target = target.replace("{id}", names[0])
    elif route_name == "a path under no route":
        target = draw(
            st.sampled_from(
                [
                    "/",
                    "/v1/",
                    "/v1/agent/",
                    "/v1/agent/sessions",
                    "/v1/agent/sessions/x/y",
                    "/v1/ephemeral-keys/x",
                ]
            )
            | segments().map(lambda s: f"/v1/agent/{s}")
        )
    if route_name.startswith("POST /v1/agent/sessions") and draw(st.booleans()):
        body = draw(bodies(valid(INO, "rest.AgentSessionRequest")))
    content_type = draw(st.sampled_from(_CONTENT_TYPES)) if body is not None else None
    return Request(route_name, method, target, auth, content_type, body, names)


@attrs.define
class Public:
    """The public listener of the runner under test, its file, and the credentials and ids examples name."""

    addresses: Addresses
    journal: Path
    marks: dict[str, str] = attrs.Factory(dict)

    def client(self, bearer: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://{self.addresses.public}",
            headers={"Authorization": f"Bearer {bearer}"},
            timeout=20,
        )

    async def mint(self, **fields: object) -> str:
        async with self.client(API_KEY) as client:
            minted = await client.post("/v1/ephemeral-keys", json=fields)
        assert minted.status_code == 201, minted.text
        token: str = minted.json()["token"]
        return token

    async def conversation(self, token: str) -> str:
        async with self.client(token) as client:
            created = await client.post("/v1/agent/sessions")
        assert created.status_code == 201, created.text
        session_id: str = created.json()["session_id"]
        return session_id

    def bind(self, request: Request) -> Request:
        """``request`` with this runner's credentials and ids in place of its marks."""

        def bound(text: str) -> str:
            for mark, value in self.marks.items():
                text = text.replace(mark, value)
            return text

        body = request.body
        if body is not None:
            data = body.data
            for mark, value in self.marks.items():
                data = data.replace(mark.encode(), value.encode())
            body = attrs.evolve(body, data=data)
        auth = bound(request.auth) if request.auth is not None else None
        return attrs.evolve(request, target=bound(request.target), auth=auth, body=body)


async def prepare(target: Public) -> None:
    """The credentials and conversations examples name: a person's, another's, spent ones."""
    marks = target.marks
    marks[KEY] = API_KEY
    marks[EXPIRED] = await target.mint(end_user_id="fuzz-expired", ttl_seconds=1)
    marks[TOKEN] = await target.mint(end_user_id="fuzz")
    marks[OTHER] = await target.mint(end_user_id="fuzz-other")
    marks[REVOKED] = await target.mint(end_user_id="fuzz-revoked")
    async with target.client(API_KEY) as client:
        revoked = await client.post(f"/v1/ephemeral-keys/{_token_id(marks[REVOKED])}/revoke")
        assert revoked.status_code == 200, revoked.text
        marks[LIVE] = await target.conversation(marks[TOKEN])
        marks[OTHERS] = await target.conversation(marks[OTHER])
        marks[GONE] = await target.conversation(marks[TOKEN])
        deleted = await client.delete(f"/v1/agent/sessions/{marks[GONE]}")
        assert deleted.status_code == 200, deleted.text
    # The live conversation has a transcript to read and to compact (and the expired key its second).
    await take_turn(target.addresses.public, marks[TOKEN], marks[LIVE])
    await wait_calls_ended(target)
    async with target.client(marks[EXPIRED]) as client:
        with trio.fail_after(10):  # its second is over by now, or soon
            while (await client.get("/v1/agent/relations")).status_code != 401:
                await trio.sleep(0.1)


async def wait_calls_ended(target: Public) -> None:
    """Wait until the runner holds no call: a socket's call ends (and is journaled) after it closed."""
    async with httpx.AsyncClient(
        base_url=f"http://{target.addresses.management}",
        headers={"Authorization": f"Bearer {MANAGEMENT_TOKEN}"},
        timeout=20,
    ) as client:
        with trio.fail_after(20):
            while (await client.get("/v1/runner")).json()["activeSessions"]:
                await trio.sleep(0.05)


def _token_id(token: str) -> str:
    return token.split("_")[1]


def file_state(journal: Path) -> str:
    """A digest of every row of the runner's file (its tables, as one read transaction)."""
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, isolation_level=None)
    digest = hashlib.sha256()
    try:
        conn.execute("BEGIN")
        tables = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1")
        ]
        for table in tables:
            rows = sorted(repr(row) for row in conn.execute(f'SELECT * FROM "{table}"'))
            digest.update(f"{table}:{len(rows)}:{''.join(rows)}".encode())
        conn.execute("COMMIT")
    finally:
        conn.close()
    return digest.hexdigest()


TALLY: Counter[str] = Counter()
"""Requests checked, by route (``python -m bench.fuzz`` prints it)."""
ANSWERS: Counter[tuple[str, str]] = Counter()
"""What they were answered, by route: ``"201"``, ``"401 unauthorized"``, ..."""


def _check_answer(request: Request, status: int, body: bytes) -> str | None:
    """The ErrorBody code of a refusal, None for a 2xx; Violation for anything undocumented."""
    route = ROUTES[request.route]
    credential = _credential(request.auth)
    if status == 500 or status not in {200, 201} | set().union(*STATUS_OF.values()):
        raise Violation(f"status {status}: {body[:300]!r}")
    # A segment that is a slash once decoded (a%2Fb) leaves the path under no route.
    routed = (
        route.answers is not None
        and request.method == route.method
        and not any("/" in unquote(name) for name in request.names)
    )
    if routed and credential not in route.takes and status != 401:
        raise Violation(f"{status} for a credential the route does not take: {body[:300]!r}")
    if request.method == "HEAD":
        return None if status < 300 else "(head)"
    if status < 300:
        if request.method == "OPTIONS":  # Quart's answer naming the methods a path takes
            return None
        if not routed or credential not in route.takes:
            raise Violation(f"{status} for {request.method} {request.target[:80]} with {request.auth!r}")
        assert route.answers is not None
        _validate(_VALIDATORS[route.answers], body)
        return None
    error = _validate(_ERROR_BODY, body)
    code = error["error"]
    if status not in STATUS_OF.get(code, ()):
        raise Violation(f"{code} answered with status {status}")
    return str(code)


def _validate(validator: jsonschema.Draft202012Validator, body: bytes) -> dict[str, object]:
    try:
        value = json.loads(body)
    except ValueError:
        raise Violation(f"a body that is not JSON: {body[:200]!r}") from None
    errors = list(validator.iter_errors(value))
    if errors:
        raise Violation(f"not a {validator.schema['$ref']}: {errors[0].message} in {body[:300]!r}")
    assert isinstance(value, dict)
    return value


async def check_request(target: Public, drawn: Request) -> None:
    """Send ``drawn`` and check what must hold; raise :class:`Violation` if it did not."""
    TALLY[drawn.route] += 1
    marks = target.marks
    if VICTIM_KEY in drawn.target:
        marks[VICTIM_KEY] = _token_id(await target.mint(end_user_id="fuzz-victim"))
    if VICTIM in drawn.target:
        marks[VICTIM] = await target.conversation(marks[TOKEN])
    request = target.bind(drawn)
    before = file_state(target.journal)
    status, _, body = await exchange(target.addresses.public, request)
    refused = _check_answer(drawn, status, body)
    ANSWERS[drawn.route, f"{status} {refused or ''}".strip()] += 1
    if refused is not None and file_state(target.journal) != before:
        raise Violation(f"refused {refused} ({status}) but the runner's file changed")


async def check_healthy(target: Public) -> None:
    """After the storm: /health, and a new conversation of the person takes a turn."""
    await check_health(target.addresses)
    token = await target.mint(end_user_id="fuzz-after")
    await take_turn(target.addresses.public, token, await target.conversation(token))
    await wait_calls_ended(target)
