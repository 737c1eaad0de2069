"""The built-in agent: a hotel concierge that works offline.

It speaks with hibari's neural voice, hears with Whisper tiny.en (both inside their
wheels) and thinks with the deterministic local model, so ``runner serve`` needs no
network and no keys. It shows most of the authoring
API: instructions computed from the call, tools (one unlocked by a message), a skill, an
experiment on the greeting, client context, messages both ways and live settings.
"""

from __future__ import annotations

from runner.agent import LLM, STT, TTS, Agent, Context, Skill

FORECASTS = {
    "lisbon": "sunny and 24 degrees",
    "berlin": "cloudy and 12 degrees",
    "oslo": "snowing and minus 3 degrees",
}

agent = Agent(
    "concierge",
    instructions=(
        "You are the concierge of Hotel Lumen. "
        "Breakfast is served from seven to eleven in the garden room. "
        "Checkout is at noon, and late checkout costs twenty euros. "
        "The spa is open from nine in the morning to nine in the evening."
    ),
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="hibari", voice="heart"),
    stt=STT(provider="whisper", language="en"),
    greeting=lambda ctx: GREETINGS[ctx.experiment.greeting].format(event=ctx.client.event or "your stay"),
    adjustable={"client": ["tts.voice"], "host": ["tts.voice", "stt.language", "llm"]},
    experiments={"greeting": {"casual": 1, "formal": 1}},
    from_client={"greeting": "greeting"},
    state=lambda: {"verified": False, "orders": []},
)

GREETINGS = {
    "casual": "Hi! Welcome to Hotel Lumen, great to have you here for {event}.",
    "formal": "Good day, and welcome to Hotel Lumen. How may I help with {event}?",
}


@agent.instructions
def about_the_call(ctx: Context) -> str | None:
    if ctx.call.direction == "outbound":
        return "You called the guest: say why you are calling first."
    return None


@agent.tool
def weather(ctx: Context, city: str) -> str:
    """Tell the weather forecast for a city."""
    forecast = FORECASTS.get(city.strip().lower().rstrip("?.!"))
    return f"In {city} it is {forecast}." if forecast else f"I have no forecast for {city}."


@agent.tool
def room_service(ctx: Context, dish: str) -> str:
    """Order a dish from room service to the guest's room."""
    ctx.state["orders"].append(dish)
    ctx.send.to_client("order-placed", {"dish": dish, "count": len(ctx.state["orders"])})
    ctx.send.to_host("concierge.order", {"dish": dish})
    return f"{dish} will be in your room in twenty minutes."


@agent.on_message("verify", sender="client")
def verify(ctx: Context, payload: dict[str, object]) -> dict[str, object]:
    """The app says the guest proved who they are: unlock the member skill."""
    ctx.state["verified"] = payload.get("member") is True
    return {"verified": ctx.state["verified"]}


members = agent.skill(
    Skill(
        "members",
        instructions="The guest is a verified member: offer the upgrade when they ask about rooms.",
        when=lambda ctx: bool(ctx.state["verified"]),
    )
)


@members.tool
def upgrade_room(ctx: Context, room: str) -> str:
    """Upgrade a member's room."""
    return f"Room {room} is upgraded to a suite."
