"""Agents the LiveKit tests start runners with: ``runner serve tests/livekit/lk_agents.py:NAME``.

Offline and deterministic: the embedded defaults speak (hibari) and hear (Whisper tiny.en,
Silero VAD), the local rule-based model answers with sentences of its instructions. Agents
that only exchange messages keep espeak-ng, the light voice.
"""

from __future__ import annotations

import attrs
import trio

from runner.agent import LLM, STT, TTS, Agent, Context, transfer_call

REPLY = "Thank you very much, my name is Mary."


@attrs.frozen
class Quote:
    plan: str


agent = Agent(
    "lk-test",
    instructions=f"{REPLY} The garden room serves breakfast from seven to eleven.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    stt=STT(provider="whisper", language="en"),
    greeting="Hello there.",
    adjustable={"client": ["tts.voice"], "host": ["tts.voice", "stt.language", "llm"]},
    state=lambda: {"pings": 0},
)


@agent.on_message("ping", sender="client")
def ping(ctx: Context, payload: dict[str, object]) -> dict[str, object]:
    ctx.state["pings"] += 1
    ctx.send.to_client("pinged", {"count": ctx.state["pings"], "echo": payload})
    return {"pong": payload.get("n") if isinstance(payload, dict) else None}


@agent.on_message("quote", sender="client", schema=Quote)
def quote(ctx: Context, request: Quote) -> dict[str, object]:
    return {"plan": request.plan, "price": 17 if request.plan == "basic" else 42}


@agent.on_message("boom", sender="client")
def boom(ctx: Context, payload: object) -> None:
    raise RuntimeError("the test handler failed on purpose")


@agent.on_message("ops.notice", sender="host")
def notice(ctx: Context, payload: dict[str, object]) -> None:
    ctx.send.to_client("notice", payload)


# No greeting and no ears: for calls that only exchange messages.
quiet = Agent(
    "lk-quiet",
    instructions="You answer briefly.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en"),
    adjustable={"client": ["tts.voice"], "host": ["tts.voice"]},
    state=lambda: {"pings": 0},
)
quiet.handlers = agent.handlers


# A long opening line, to talk over.
talker = Agent(
    "lk-talker",
    instructions=f"{REPLY}",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    stt=STT(provider="whisper", language="en"),
    greeting=(
        "Welcome to the long greeting of this test. It goes on for a while on purpose. "
        "It tells you about the garden room and the breakfast served there every morning. "
        "It tells you about the spa and its opening hours, and the late checkout. "
        "It keeps talking so that you can talk over it and see it stop. "
        "If you can still hear this sentence, the barge-in did not work."
    ),
)


# The seed's client-side example (tests/livekit/test_browser_client.py): a claim opens a form in
# the app, a quote has a price. KugelAudio takes the example's numeric voice 17; it never speaks
# here (no greeting, no ears), so its key is never used and nothing reaches the network.
web = Agent(
    "lk-web",
    instructions="You answer briefly.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="kugelaudio", voice=1072),
    adjustable={"client": ["tts.voice"], "host": ["tts.voice"]},
)


@attrs.frozen
class Claim:
    claimId: str


@web.on_message("claim-submitted", sender="client", schema=Claim)
def claim_submitted(ctx: Context, claim: Claim) -> dict[str, object]:
    ctx.send.to_client("show-form", {"claimId": claim.claimId, "fields": ["name", "date"]})
    return {"received": claim.claimId}


@web.on_message("quote", sender="client", schema=Quote)
def web_quote(ctx: Context, request: Quote) -> dict[str, object]:
    return {"price": 17 if request.plan == "basic" else 42}


@web.on_message("slow", sender="client")
async def slow(ctx: Context, payload: object) -> dict[str, object]:
    await trio.sleep(3)
    return {"done": True}


web.on_message("boom", sender="client")(boom)

# The same, with nothing the client may adjust.
web_fixed = Agent(
    "lk-web-fixed",
    instructions="You answer briefly.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en"),
    adjustable={"host": ["tts.voice"]},
)
web_fixed.handlers = web.handlers


# A phone line's agent (tests/livekit/test_sip.py): takes a PIN from the caller's keys (#
# ends it) and says whether it is right, or transfers to the front desk on 0; presses the keys
# a host message names; and tries to show the caller's app a notice, which a phone does not have.
keypad = Agent(
    "lk-keypad",
    instructions="You take PINs.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    greeting="Enter your PIN.",
    state=lambda: {"pin": ""},
)
keypad.on_message("ops.notice", sender="host")(notice)


@keypad.on_dtmf
async def pin(ctx: Context, digit: str) -> str | None:
    if digit == "0" and not ctx.state["pin"]:
        # 0 first: the front desk, through the host (it dials the desk into the room).
        moved = await transfer_call(ctx, "sip:desk@hotel", reason="front desk", timeout=10)
        return "Connecting you to the front desk." if moved.outcome == "transferred" else "Nobody is there."
    if digit != "#":
        ctx.state["pin"] += digit
        return None
    entered, ctx.state["pin"] = ctx.state["pin"], ""
    return "That PIN is right." if entered == "1234" else "That PIN is wrong."


@keypad.on_message("press", sender="host")
def press(ctx: Context, payload: dict[str, object]) -> None:
    ctx.send.dtmf(str(payload["digits"]))


def _back(ctx: Context) -> str:
    said = [turn.text for turn in ctx.call.history if turn.role == "user"]
    # One sentence: the voice speaks it without the pause it leaves between sentences.
    return f"Sorry, the line dropped, you said: {said[-1]}" if said else "Sorry, the line dropped."


# Picks up a call its runner dropped by saying back the caller's last words (tests/livekit/test_failover.py).
resumer = Agent(
    "lk-resumer",
    instructions=f"{REPLY}",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    stt=STT(provider="whisper", language="en"),
    greeting="Hello there.",
    resume_line=_back,
)


def _opening(ctx: Context) -> str:
    if ctx.call.direction == "outbound":
        return "Hello, the hotel is calling you back."
    return "Hello there."


# Opens by the call's direction: a host that dialed the phone says so in the start request.
dialer = Agent(
    "lk-dialer",
    instructions=f"{REPLY}",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    greeting=_opening,
)
