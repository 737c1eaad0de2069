"""Agents the agent-WebSocket tests start runners with (``runner serve tests.websocket.ino_agents:NAME``).

All of them think with the deterministic local model, so every reply is known in advance:
a question that shares words with an instruction sentence gets that sentence; words that
name a tool call it.
"""

from __future__ import annotations

from runner.agent import LLM, STT, TTS, Agent, Context

INSTRUCTIONS = (
    "You are the concierge of Hotel Lumen. "
    "Breakfast is served from seven to eleven in the garden room. "
    "Checkout is at noon, and late checkout costs twenty euros. "
    "The spa is open from nine in the morning to nine in the evening."
)
GREETING = "Welcome to Hotel Lumen."
FORECASTS = {"lisbon": "sunny and 24 degrees", "oslo": "snowing"}

# espeak's US English with the f2 variant: the light voice, for agents that need no better.
CLEAR_VOICE = "en-us+f2"

# Speaks and hears with the embedded defaults (hibari, Whisper); greets every new conversation.
speaking = Agent(
    "ino-speaking",
    instructions=INSTRUCTIONS,
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    stt=STT(provider="whisper", language="en"),
    greeting=GREETING,
    adjustable={"host": ["tts.voice", "llm"]},
)


@speaking.tool
def weather(ctx: Context, city: str) -> str:
    """Tell the weather forecast for a city."""
    forecast = FORECASTS.get(city.strip().lower().rstrip("?.!"))
    return f"In {city} it is {forecast}." if forecast else f"I have no forecast for {city}."


@speaking.tool(filler="One moment, I am calling the front desk.")
def taxi(ctx: Context, destination: str) -> str:
    """Order a taxi to a destination."""
    return f"A taxi to {destination} will be at the door in ten minutes."


# Its filler is never said: a tool that asks first waits for the answer, then runs at the start
# of the next turn.
@speaking.tool(ask_first=True, filler="Let me book that.")
def book_table(ctx: Context, guests: int) -> str:
    """Book a table in the restaurant."""
    ctx.state.setdefault("bookings", []).append(guests)
    return f"A table for {guests} is booked for tonight."


@speaking.on_message("note", sender="host")
def note(ctx: Context, payload: dict[str, object]) -> dict[str, object]:
    ctx.state["note"] = payload
    return {"noted": True}


speaking.app_tool(
    "open_page",
    "Open a page of the hotel app.",
    {"type": "object", "properties": {"page": {"type": "string"}}, "required": ["page"]},
    timeout_ms=30_000,
)
speaking.app_tool("vibrate_phone", "Vibrate the guest's phone.", action_only=True)
speaking.app_tool(
    "check_booking",
    "Check a booking reference in the app.",
    {"type": "object", "properties": {"reference": {"type": "string"}}, "required": ["reference"]},
    timeout_ms=400,
)

# Writes only: no voice, no ears, no greeting.
text_only = Agent("ino-text", instructions=INSTRUCTIONS, llm=LLM(provider="local", model="local"))

# A voice and ears that need a key the tests never give: every speech and transcription fails.
failing_voice = Agent(
    "ino-failing-voice",
    instructions=INSTRUCTIONS,
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="openai", voice="alloy"),
    stt=STT(provider="openai"),
)

# Issue 9's agent: searches its knowledge before each reply, reports moods, keeps a
# relationship with each person, and compacts a conversation past 60 words. Text only.
knowing = Agent(
    "ino-knowing",
    instructions=INSTRUCTIONS,
    llm=LLM(provider="local", model="local"),
    knowledge="first",
    moods=True,
    relations=True,
    compact_after_words=60,
)
knowing.app_tool(
    "open_page",
    "Open a page of the hotel app.",
    {"type": "object", "properties": {"page": {"type": "string"}}, "required": ["page"]},
    timeout_ms=30_000,
)

# Searches its knowledge only when the model calls the platform's search tool.
searching = Agent(
    "ino-searching", instructions=INSTRUCTIONS, llm=LLM(provider="local", model="local"), knowledge="tool"
)

# Knowledge entries for both (``runner knowledge load``).
KNOWLEDGE = [
    {
        "entry_id": "pool",
        "title": "Rooftop pool",
        "text": "The rooftop pool is open from eight in the morning to ten at night.",
    },
    {
        "entry_id": "parking",
        "title": "Parking",
        "text": "Guests park in the garage under the hotel for fifteen euros a night.",
    },
]

# Sends thinking summaries to a client that asks for them (the local model's are the rule it
# followed). Text only; the same weather tool as ``speaking``.
thinking = Agent(
    "ino-thinking",
    instructions=INSTRUCTIONS,
    llm=LLM(provider="local", model="local"),
    thinking_summaries="auto",
)


@thinking.tool(name="weather")
def thinking_weather(ctx: Context, city: str) -> str:
    """Tell the weather forecast for a city."""
    return weather(ctx, city)
