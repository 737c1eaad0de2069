"""Agents the tests start runners with (``runner serve tests.agents:NAME``)."""

from __future__ import annotations

import os
from typing import Any

import attrs

from runner.agent import (
    LLM,
    STT,
    TTS,
    Agent,
    Context,
    HostTimeoutError,
    HostUnavailableError,
    Skill,
    transfer_call,
    transfer_call_tool,
)

# Writes nothing but what the call itself writes: curb.started, curb.messages, curb.ended.
quiet = Agent("quiet", instructions="You answer briefly.")


# -- App messages and host messages (tests/test_messages.py) ---------------------------------


@attrs.frozen
class Lead:
    score: float


@attrs.frozen
class Claim:
    claim_id: str


# Handlers for each kind of delivery and refusal, from the host and from the client. Every
# effect is visible from outside: a reply in the curb.message record, a host record, a
# message to the app.
messenger = Agent("messenger", instructions="You relay messages.", state=lambda: {"order": []})


@messenger.on_message("note", sender="host")
def _note(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {"seen": payload}


@messenger.on_message("lead", sender="host", schema=Lead)
def _lead(ctx: Context, lead: Lead) -> dict[str, Any]:
    ctx.send.to_host("lead.scored", {"score": lead.score})
    return {"score": lead.score}


@messenger.on_message("flaky", sender="host")
def _flaky_first(ctx: Context, payload: dict[str, Any]) -> None:
    ctx.send.to_host("flaky.first", {"attempt": payload.get("attempt")})


@messenger.on_message("flaky", sender="host")
def _flaky_fails(ctx: Context, payload: dict[str, Any]) -> None:
    if payload.get("fail"):
        raise RuntimeError("told to fail")


@messenger.on_message("flaky", sender="host")
def _flaky_last(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.send.to_host("flaky.last", {"attempt": payload.get("attempt")})
    return {"attempt": payload.get("attempt")}


@messenger.on_message("relay", sender="host")
def _relay(ctx: Context, payload: dict[str, Any]) -> Any:
    """``{toClient: {key: count}, toHost: [key], data}``: send as told; reply with ``data``."""
    for key, count in payload.get("toClient", {}).items():
        for n in range(count):
            ctx.send.to_client(key, {"n": n})
    for key in payload.get("toHost", []):
        ctx.send.to_host(key, payload.get("data"))
    return payload.get("data")


@messenger.on_message("ask", sender="host")
async def _ask(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    """``{key, data, timeoutS}``: ask the host; reply with how the ask ended."""
    try:
        answer = await ctx.ask_host(payload["key"], payload.get("data"), timeout=payload.get("timeoutS", 10))
    except HostTimeoutError:
        return {"outcome": "timeout"}
    except HostUnavailableError:
        return {"outcome": "unavailable"}
    return {"outcome": "answered", "answer": answer}


@messenger.on_message("human.decision", sender="host")
def _decision(ctx: Context, payload: dict[str, Any]) -> None:
    ctx.send.to_host("decision.seen", payload)


@messenger.on_message("claim-submitted", sender="client", schema=Claim)
def _claim(ctx: Context, claim: Claim) -> dict[str, Any]:
    ctx.send.to_client("show-status", {"status": "received", "claimId": claim.claim_id})
    return {"received": claim.claim_id}


@messenger.on_message("ordered", sender="client")
def _ordered_first(ctx: Context, payload: dict[str, Any]) -> str:
    ctx.state["order"].append("first")
    return "first"


@messenger.on_message("ordered", sender="client")
def _ordered_second(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.state["order"].append("second")
    return {"last": "second", "order": list(ctx.state["order"])}


@messenger.on_message("broken", sender="client")
def _broken(ctx: Context, payload: dict[str, Any]) -> None:
    raise ValueError("this handler always fails")


@messenger.on_message("whoami", sender="client")
def _whoami(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.send.to_client("you-are", {"sessionId": ctx.session_id})
    return {"sessionId": ctx.session_id}


@messenger.on_message("ask", sender="client")
async def _client_ask(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    return await _ask(ctx, payload)


# A direct-join runner's agent: its greeting tells the host it is there.
def _greet_host(ctx: Context) -> str:
    ctx.send.to_host("agent.joined", {"sessionId": ctx.session_id})
    return "Hello."


greets_host = Agent("greets-host", instructions="You greet.", greeting=_greet_host)


# -- Transfers (in-process tests) ------------------------------------------------------------

switchboard = Agent(
    "switchboard",
    instructions="You route callers to the right department.",
    tts=TTS(provider="espeak", voice="en"),
    stt=STT(provider="pocketsphinx"),
)
switchboard.tools.append(transfer_call_tool(targets={"sales": "sip:sales@example.com"}, timeout=5.0))


@switchboard.tool
async def escalate(ctx: Context) -> dict[str, Any]:
    """Escalate to a supervisor."""
    outcome = await transfer_call(ctx, "sip:supervisor@example.com", reason="escalation", timeout=1.0)
    return {"outcome": outcome.outcome, "code": outcome.code, "reason": outcome.reason}


# -- Live session settings (tests/test_settings.py) ------------------------------------------

# The offline voice and recognizer; the host may change the voice, the language and the
# model, the client only the voice.
tunable = Agent(
    "tunable",
    instructions="You answer briefly.",
    tts=TTS(provider="espeak", voice="en"),
    stt=STT(provider="pocketsphinx"),
    adjustable={"client": ["tts.voice"], "host": ["tts.voice", "stt.language", "llm"]},
)

# An OpenAI-compatible endpoint of the author's own; the client may switch models on it.
own_endpoint = Agent(
    "own-endpoint",
    instructions="You answer briefly.",
    llm=LLM(
        provider="openai-compatible",
        model="house-model",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="HOUSE_KEY",
    ),
    tts=TTS(provider="espeak", voice="en"),
    adjustable={"client": ["tts.voice", "llm"], "host": ["tts.voice", "llm"]},
)

# Greets as soon as it joins, so a change made while the call starts is heard in its first words.
tunable_greeter = Agent(
    "tunable-greeter",
    instructions="You answer briefly.",
    tts=TTS(provider="espeak", voice="en"),
    greeting="Hello, thank you for calling the help line. How can I help you today?",
    adjustable={"host": ["tts.voice"]},
)

# A KugelAudio voice (numeric ids). This runner has no KugelAudio speech provider, so it is
# only served in-process (no warmup) and never asked to speak.
kugel = Agent(
    "kugel",
    instructions="You answer briefly.",
    tts=TTS(provider="kugelaudio", voice=1072),
    adjustable={"client": ["tts.voice"], "host": ["tts.voice", "llm"]},
)

# A skill with a voice of its own, mounted once the host says so.
skilled = Agent(
    "skilled",
    instructions="You answer briefly.",
    tts=TTS(provider="espeak", voice="en"),
    skills=[Skill("formal", when=lambda ctx: ctx.state["formal"], tts=TTS(provider="espeak", voice="en-us"))],
    state=lambda: {"formal": False},
    adjustable={"host": ["tts.voice"]},
)


@skilled.on_message("formal", sender="host")
def _formal(ctx: Context, payload: dict[str, Any]) -> None:
    ctx.state["formal"] = True


def speaker(base_url: str) -> Agent:
    """An agent whose model is the OpenAI-compatible endpoint at ``base_url`` (a test's own)."""
    return Agent(
        "speaker",
        instructions="You answer briefly.",
        llm=LLM(provider="openai-compatible", model="house-model", base_url=base_url),
        tts=TTS(provider="espeak", voice="en"),
        adjustable={"host": ["tts.voice", "llm"]},
    )


# -- Operability (tests/test_cli.py, tests/test_logs.py) -------------------------------------

# Names OpenAI: without OPENAI_API_KEY its warm-up fails.
needs_openai = Agent(
    "needs-openai", instructions="You answer briefly.", llm=LLM(provider="openai", model="gpt-4o-mini")
)

# Opens every call with a model turn against an endpoint that refuses connections (the test
# binds a socket without listening and passes its URL): the turn fails at the model.
unreachable_model = Agent(
    "unreachable-model",
    instructions="You answer briefly.",
    greeting=True,
    llm=LLM(
        provider="openai-compatible",
        model="house-model",
        base_url=os.environ.get("TEST_LLM_URL", "http://127.0.0.1:9/v1"),
    ),
)

# A call with a bit of everything for `runner replay --call` (tests/test_replay.py): a tool
# that answers or fails, a host handler that replies and tells the host, a typed greeting.
timeline = Agent("timeline", instructions="You tell the weather.", greeting="Hello, weather desk.", tts=None)


@timeline.tool
def weather(ctx: Context, city: str) -> str:
    """Tell the weather forecast for a city."""
    if city.strip().lower().rstrip("?.!") == "atlantis":
        raise ValueError("no station in atlantis")
    return f"In {city} it is sunny."


@timeline.on_message("note", sender="host")
def _timeline_note(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.send.to_host("note.seen", {"text": payload.get("text")})
    return {"ok": True}


# The offline engines named explicitly, so metrics and spans name known providers
# (tests/test_telemetry.py): the local model with a tool, espeak-ng, pocketsphinx.
observed = Agent(
    "observed",
    instructions="You tell the weather.",
    greeting="Welcome to the weather desk.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en"),
    stt=STT(provider="pocketsphinx", language="en"),
)


@observed.tool
def forecast(ctx: Context, city: str) -> str:
    """Tell the weather forecast for a city."""
    return f"In {city} it is sunny."


@messenger.on_message("deep", sender="host")
def _deep(ctx: Context, payload: dict[str, Any]) -> Any:
    """``{depth: N}``: reply with a value nested N arrays deep (tests/faults/test_bad_input.py)."""
    reply: Any = []
    for _ in range(int(payload.get("depth", 1)) - 1):
        reply = [reply]
    return reply


def _back(ctx: Context) -> str:
    said = [turn.text for turn in ctx.call.history if turn.role == "user"]
    return f"Sorry, the line dropped. You were saying: {said[-1]}" if said else "Sorry, the line dropped."


# Picks up a moved call by quoting the caller's last words from the history it came with.
resumer = Agent("resumer", instructions="You answer briefly.", greeting="Hello there.", resume_line=_back)


# -- Phone keys (tests/test_dtmf.py, tests/livekit/test_sip.py) ------------------------------

# Takes a PIN from the caller's keys (# ends it) and says whether it is right; presses the
# keys a host message names (navigating a menu on the other end of an outbound call).
keypad = Agent(
    "keypad",
    instructions="You take PINs.",
    greeting="Enter your PIN, then press the hash key.",
    state=lambda: {"pin": ""},
)


@keypad.on_dtmf
def _pin(ctx: Context, digit: str) -> str | None:
    if digit != "#":
        ctx.state["pin"] += digit
        return None
    pin, ctx.state["pin"] = ctx.state["pin"], ""
    return "That PIN is right." if pin == "1234" else f"{len(pin)} keys is not your PIN."


@keypad.on_message("press", sender="host")
def _press(ctx: Context, payload: dict[str, Any]) -> None:
    ctx.send.dtmf(str(payload["digits"]))
