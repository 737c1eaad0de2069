"""The authoring API: what an agent is made of, checked when it is defined."""

from __future__ import annotations

import datetime
import enum
import hashlib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import attrs
import pytest

import runner.agent as agent_api
from runner.agent import (
    LLM,
    STT,
    TTS,
    Agent,
    AgentRuntime,
    AuthoringError,
    Context,
    Skill,
    assign_variant,
    choose_experiments,
)
from runner.agent._schema import ArgumentsRefused
from runner.calls import CallContext

CODE = "AGENT_INVALID_AUTHORING_PROP"


def _runtime(
    agent: Agent, *, session_id: str = "s-auth", client: Mapping[str, str] | None = None
) -> AgentRuntime:
    client = dict(client or {})
    call = CallContext(
        session_id=session_id,
        direction="inbound",
        client=client,
        experiments=choose_experiments(agent, session_id, client, None),
    )
    return AgentRuntime(agent, call, None, host_connected=False)


def _authoring_error(excinfo: pytest.ExceptionInfo[AuthoringError]) -> str:
    message = str(excinfo.value)
    assert message.startswith(CODE), message
    assert excinfo.value.code == CODE
    return message


# -- message keys and senders -----------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["", "k" * 257, 7, None, b"bytes"], ids=["empty", "257-chars", "int", "none", "bytes"]
)
def test_an_invalid_message_key_fails_when_the_handler_is_declared(key: Any) -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:
        agent.on_message(key)  # the decorator factory itself refuses: nothing is registered
    assert "key" in _authoring_error(excinfo)
    assert agent.handlers == []


def test_a_key_of_256_characters_is_accepted() -> None:
    agent = Agent("a")

    @agent.on_message("k" * 256)
    def handle(ctx: Context, payload: object) -> None:
        return None

    assert [(h.key, h.sender) for h in agent.handlers] == [("k" * 256, "client")]


@pytest.mark.parametrize("sender", ["server", "Client", "", None, "app"])
def test_an_invalid_sender_fails_when_the_handler_is_declared(sender: Any) -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:
        agent.on_message("ok", sender=sender)
    assert "sender" in _authoring_error(excinfo)
    assert agent.handlers == []


def test_handlers_are_found_by_key_and_sender() -> None:
    agent = Agent("a")

    @agent.on_message("verify", sender="client")
    def from_client(ctx: Context, payload: object) -> None:
        return None

    @agent.on_message("verify", sender="host")
    def from_host(ctx: Context, payload: object) -> None:
        return None

    assert [h.fn for h in agent.handlers_for("verify", "client")] == [from_client]
    assert [h.fn for h in agent.handlers_for("verify", "host")] == [from_host]
    assert agent.handlers_for("other", "client") == []


# -- tools --------------------------------------------------------------------------------------


@attrs.frozen
class Guest:
    name: str
    nights: int = 1


def test_a_tool_schema_comes_from_the_signature() -> None:
    agent = Agent("a")

    @agent.tool
    def book(
        ctx: Context,
        city: str,
        nights: int,
        budget: float = 100.0,
        kind: Literal["single", "double"] = "single",
        breakfast: bool = False,
        tags: list[str] | None = None,
        extras: dict[str, str] | None = None,
        note: str | None = None,
    ) -> str:
        """Book a room in a city."""
        return "booked"

    (tool,) = agent.tools
    assert tool.name == "book"
    assert tool.description == "Book a room in a city."
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "nights": {"type": "integer"},
            "budget": {"type": "number", "default": 100.0},
            "kind": {"type": "string", "enum": ["single", "double"], "default": "single"},
            "breakfast": {"type": "boolean", "default": False},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
            "extras": {
                "anyOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        # Parameters with a default are optional for the model; nothing else may be sent.
        "required": ["city", "nights"],
        "additionalProperties": False,
    }
    spec = tool.spec()
    assert (spec.name, spec.description, spec.parameters) == (
        "book",
        "Book a room in a city.",
        tool.parameters,
    )
    # The decorator hands the function back unchanged, so it stays callable as written.
    assert book(None, "Oslo", 2) == "booked"


def test_an_attrs_parameter_becomes_an_object_schema() -> None:
    # This module, like the house style and examples/claims.py, uses
    # ``from __future__ import annotations``: attrs then keeps field types as strings.
    agent = Agent("a")

    @agent.tool
    def check_in(ctx: Context, guest: Guest) -> str:
        """Check a guest in."""
        return guest.name

    assert agent.tools[0].parameters["properties"]["guest"] == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "nights": {"type": "integer", "default": 1}},
        "required": ["name"],
        "additionalProperties": False,
    }


def test_a_tool_with_options_keeps_them() -> None:
    agent = Agent("a")

    def gate(ctx: Context) -> bool:
        return True

    @agent.tool(
        name="look-up", description="Look something up.", when=gate, ask_first=True, filler="One moment."
    )
    async def lookup(ctx: Context, query: str) -> str:
        return query

    (tool,) = agent.tools
    assert (tool.name, tool.description, tool.when, tool.ask_first, tool.filler) == (
        "look-up",
        "Look something up.",
        gate,
        True,
        "One moment.",
    )


def test_a_tool_without_a_docstring_fails() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:

        @agent.tool
        def silent(ctx: Context, city: str) -> str:
            return city

    assert "description" in _authoring_error(excinfo)
    assert agent.tools == []


def test_a_tool_parameter_without_an_annotation_fails() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:

        @agent.tool
        def vague(ctx: Context, city) -> str:
            """Something about a city."""
            return str(city)

    assert "'city'" in _authoring_error(excinfo) and "annotation" in str(excinfo.value)


class Opaque:
    pass


def test_a_tool_parameter_of_a_type_no_model_can_send_fails() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:

        @agent.tool
        def odd(ctx: Context, thing: Opaque) -> str:
            """Takes something odd."""
            return ""

    _authoring_error(excinfo)


def test_a_tool_annotation_that_names_nothing_fails_as_an_authoring_error() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:

        @agent.tool
        def typo(ctx: Context, city: Stirng) -> str:  # noqa: F821 - the misspelt annotation is what the test is about
            """A typo in an annotation."""
            return ""

    assert "'city'" in _authoring_error(excinfo)


def test_a_tool_must_take_the_context_and_named_parameters() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as no_ctx:

        @agent.tool
        def nothing() -> str:
            """Takes nothing at all."""
            return ""

    _authoring_error(no_ctx)
    with pytest.raises(AuthoringError) as star:

        @agent.tool
        def many(ctx: Context, *cities: str) -> str:
            """Takes many cities."""
            return ""

    _authoring_error(star)


def test_a_tool_name_must_be_valid_and_unique() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as bad_name:

        @agent.tool(name="look up!")
        def lookup(ctx: Context) -> str:
            """Look up."""
            return ""

    _authoring_error(bad_name)

    @agent.tool
    def weather(ctx: Context, city: str) -> str:
        """The weather."""
        return city

    with pytest.raises(AuthoringError) as twice:

        @agent.tool(name="weather")
        def other(ctx: Context, city: str) -> str:
            """Another weather."""
            return city

    assert "twice" in _authoring_error(twice)
    assert [t.name for t in agent.tools] == ["weather"]


# -- adjustable, experiments, rounds ------------------------------------------------------------


def test_adjustable_paths_are_checked_per_origin() -> None:
    agent = Agent(
        "a", adjustable={"client": ["tts.voice"], "host": ["tts.voice", "stt.language", "llm", "tts.model"]}
    )
    assert agent.adjustable == {
        "client": ("tts.voice",),
        "host": ("tts.voice", "stt.language", "llm", "tts.model"),
    }
    # Nothing is adjustable unless listed.
    assert Agent("b").adjustable == {"client": (), "host": ()}
    assert Agent("c", adjustable={"host": ["llm"]}).adjustable == {"client": (), "host": ("llm",)}


@pytest.mark.parametrize(
    "adjustable, mentions",
    [
        ({"server": ["tts.voice"]}, "origin"),
        ({"client": "tts.voice"}, "list"),
        ({"client": ["tts.speed"]}, "tts.speed"),
        ({"host": ["llm.model"]}, "llm.model"),
    ],
)
def test_invalid_adjustable_fails(adjustable: dict[str, Any], mentions: str) -> None:
    with pytest.raises(AuthoringError) as excinfo:
        Agent("a", adjustable=adjustable)
    assert mentions in _authoring_error(excinfo)


@pytest.mark.parametrize(
    "weights",
    [{}, {"a": -1, "b": 2}, {"a": 1.5, "b": 1}, {"a": "1"}, {"a": 0, "b": 0}],
    ids=["no-variants", "negative", "float", "string", "zero-total"],
)
def test_invalid_experiment_weights_fail(weights: dict[str, Any]) -> None:
    with pytest.raises(AuthoringError) as excinfo:
        Agent("a", experiments={"greeting": weights})
    assert "'greeting'" in _authoring_error(excinfo)


def test_valid_experiment_weights_are_kept() -> None:
    agent = Agent("a", experiments={"greeting": {"casual": 1, "formal": 3, "off": 0}})
    assert agent.experiments == {"greeting": {"casual": 1, "formal": 3, "off": 0}}


def test_max_tool_rounds_must_not_be_negative() -> None:
    with pytest.raises(AuthoringError) as excinfo:
        Agent("a", max_tool_rounds=-1)
    _authoring_error(excinfo)
    assert Agent("a", max_tool_rounds=0).max_tool_rounds == 0


def test_an_agent_and_a_skill_need_names() -> None:
    with pytest.raises(AuthoringError) as no_agent:
        Agent("")
    _authoring_error(no_agent)
    with pytest.raises(AuthoringError) as no_skill:
        Skill("")
    _authoring_error(no_skill)


# -- what the model is offered ------------------------------------------------------------------


def _gated_agent() -> Agent:
    agent = Agent(
        "gated",
        instructions="You help guests.",
        tts=TTS(provider="espeak", voice="en"),
        stt=STT(provider="pocketsphinx"),
        state=lambda: {"verified": False, "vip": False},
    )

    @agent.instructions
    def direction(ctx: Context) -> str | None:
        return "You called the guest." if ctx.call.direction == "outbound" else None

    @agent.tool
    def weather(ctx: Context, city: str) -> str:
        """Tell the weather for a city."""
        return city

    @agent.tool(when=lambda ctx: ctx.state["vip"])
    def champagne(ctx: Context, room: str) -> str:
        """Send champagne to a room."""
        return room

    members = agent.skill(
        Skill(
            "members",
            instructions="The guest is a verified member.",
            when=lambda ctx: ctx.state["verified"],
            llm=LLM(provider="openai", model="gpt-4o-mini"),
            tts=TTS(provider="espeak", voice="en-us+f2"),
        )
    )

    @members.tool
    def upgrade_room(ctx: Context, room: str) -> str:
        """Upgrade a member's room."""
        return room

    return agent


def test_offer_is_recomputed_from_the_calls_state() -> None:
    agent = _gated_agent()
    runtime = _runtime(agent)

    before = runtime.offer()
    assert [t.name for t in before.tools] == ["weather"]
    assert before.skills == ()
    assert before.instructions == "You help guests."
    assert (before.llm, before.tts) == (
        LLM(provider="local", model="local"),
        TTS(provider="espeak", voice="en"),
    )

    runtime.ctx.state["vip"] = True
    assert [t.name for t in runtime.offer().tools] == ["weather", "champagne"]

    runtime.ctx.state["verified"] = True
    after = runtime.offer()
    assert [t.name for t in after.tools] == ["weather", "champagne", "upgrade_room"]
    assert after.skills == ("members",)
    assert after.instructions == "You help guests.\n\nThe guest is a verified member."
    # A mounted skill's providers take over from the agent's.
    assert after.llm == LLM(provider="openai", model="gpt-4o-mini")
    assert after.tts == TTS(provider="espeak", voice="en-us+f2")
    assert after.stt == STT(provider="pocketsphinx")
    assert after.tool("upgrade_room") is not None and after.tool("nope") is None

    runtime.ctx.state["verified"] = False
    runtime.ctx.state["vip"] = False
    assert [t.name for t in runtime.offer().tools] == ["weather"]
    # Each call has its own state: another call of the same agent starts locked.
    assert [t.name for t in _runtime(agent, session_id="other").offer().tools] == ["weather"]


def test_instructions_computed_from_the_call() -> None:
    agent = _gated_agent()
    call = CallContext(session_id="out", direction="outbound", client={}, experiments={})
    runtime = AgentRuntime(agent, call, None, host_connected=False)
    assert runtime.offer().instructions == "You help guests.\n\nYou called the guest."
    assert runtime.ctx.call.direction == "outbound"


# -- experiments --------------------------------------------------------------------------------


def _by_the_rule(session_id: str, experiment: str, weights: Mapping[str, int]) -> str:
    """The seed's rule, written out from its description."""
    digest = hashlib.sha256(f"{session_id}:{experiment}".encode()).digest()
    value = int.from_bytes(digest[:8], byteorder="big", signed=False)
    remaining = value % sum(weights.values())
    for name in sorted(weights):
        if weights[name] > remaining:
            return name
        remaining -= weights[name]
    raise AssertionError("no variant")


WEIGHTS = [
    {"casual": 1, "formal": 1},
    {"b": 3, "a": 1},  # declared out of order: the walk goes by name
    {"control": 90, "treatment": 10},
    {"x": 0, "y": 5, "z": 2},
]


@pytest.mark.parametrize("weights", WEIGHTS)
def test_assign_variant_follows_the_hash_rule(weights: dict[str, int]) -> None:
    seen = set()
    for i in range(200):
        session_id = f"sess-{i:04d}"
        expected = _by_the_rule(session_id, "greeting", weights)
        assert assign_variant(session_id, "greeting", weights) == expected, session_id
        seen.add(expected)
    # Every variant with weight is reachable over 200 calls; none without weight is.
    assert seen == {name for name, weight in weights.items() if weight > 0}


# (session id, experiment, weights, first 8 bytes of SHA-256 hex, remainder, variant), worked
# out with hashlib by hand: the walk goes down the variants sorted by name.
VECTORS = [
    ("call-1", "greeting", {"casual": 1, "formal": 1}, "7e4aca3b94a310ed", 1, "formal"),
    ("call-2", "greeting", {"casual": 1, "formal": 1}, "8e8c73ec5f82d8e8", 0, "casual"),
    ("call-3", "greeting", {"formal": 1, "casual": 1}, "f4ef062fae3e2e13", 1, "formal"),
    ("RM_abc", "voice", {"low": 2, "high": 1}, "3d1a64b96aa3426e", 1, "low"),
    ("sess-42", "price", {"c": 70, "b": 20, "a": 10}, "25c3808757e98098", 40, "c"),
]


@pytest.mark.parametrize("session_id, experiment, weights, head, remainder, variant", VECTORS)
def test_assign_variant_known_vectors(
    session_id: str, experiment: str, weights: dict[str, int], head: str, remainder: int, variant: str
) -> None:
    digest = hashlib.sha256(f"{session_id}:{experiment}".encode()).digest()
    assert digest[:8].hex() == head
    assert int(head, 16) % sum(weights.values()) == remainder
    assert assign_variant(session_id, experiment, weights) == variant


def test_from_client_picks_a_named_variant_and_ignores_other_values() -> None:
    weights = {"casual": 1, "formal": 1}
    for i in range(20):
        session_id = f"c{i}"
        assert assign_variant(session_id, "greeting", weights, {"style": "formal"}, "style") == "formal"
        assert assign_variant(session_id, "greeting", weights, {"style": "casual"}, "style") == "casual"
        by_rule = _by_the_rule(session_id, "greeting", weights)
        # A value that names no variant, a missing key, or no from_client: the hash rule.
        assert assign_variant(session_id, "greeting", weights, {"style": "loud"}, "style") == by_rule
        assert assign_variant(session_id, "greeting", weights, {}, "style") == by_rule
        assert assign_variant(session_id, "greeting", weights, {"style": "formal"}, None) == by_rule


def test_a_call_reads_its_variants_and_the_host_can_choose() -> None:
    agent = Agent(
        "exp",
        experiments={"greeting": {"casual": 1, "formal": 1}, "voice": {"high": 1, "low": 2}},
        from_client={"greeting": "greeting"},
    )
    runtime = _runtime(agent, session_id="s-77", client={"greeting": "formal"})
    assert runtime.ctx.experiment.greeting == "formal"
    assert runtime.ctx.experiment.voice == _by_the_rule("s-77", "voice", {"high": 1, "low": 2})
    with pytest.raises(AttributeError):
        runtime.ctx.experiment.colour  # noqa: B018 - the attribute read itself is what must raise
    assert runtime.ctx.client.greeting == "formal"
    assert runtime.ctx.client.absent is None
    # Variants the host sent win over the rule and the client.
    sent = choose_experiments(agent, "s-77", {"greeting": "formal"}, {"greeting": "casual"})
    assert sent["greeting"] == "casual"


# -- the package --------------------------------------------------------------------------------


def test_the_public_names_are_exported_once() -> None:
    public = [name for name in vars(agent_api) if not name.startswith("_")]
    expected = {
        "Agent",
        "AuthoringError",
        "Context",
        "HostTimeoutError",
        "HostUnavailableError",
        "LLM",
        "MessageHandler",
        "Offer",
        "STT",
        "Skill",
        "TTS",
        "Tool",
        "TransferOutcome",
        "assign_variant",
        "load_agent",
        "transfer_call",
        "transfer_call_tool",
    }
    assert expected <= set(public)
    for name in expected:
        assert getattr(agent_api, name).__module__.startswith("runner.agent._"), name


# -- tool parameters through pydantic: descriptions, enums, dates, attrs, defaults ----------------


class Meal(enum.Enum):
    breakfast = "breakfast"
    dinner = "dinner"


@attrs.frozen
class Party:
    """Who is coming."""

    lead: Annotated[str, "The name the table is under"]
    size: int = 2
    notes: list[str] = attrs.Factory(list)


def test_tool_parameters_take_descriptions_enums_dates_attrs_and_defaults() -> None:
    agent = Agent("a")

    @agent.tool
    def reserve(
        ctx: Context,
        day: Annotated[datetime.date, "The day of the reservation"],
        meal: Meal,
        party: Party,
        at: datetime.datetime | None = None,
        seat: Literal["inside", "terrace"] = "inside",
    ) -> str:
        """Reserve a table."""
        return "ok"

    (tool,) = agent.tools
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date", "description": "The day of the reservation"},
            "meal": {"type": "string", "enum": ["breakfast", "dinner"]},
            "party": {
                "type": "object",
                "description": "Who is coming.",
                "properties": {
                    "lead": {"type": "string", "description": "The name the table is under"},
                    "size": {"type": "integer", "default": 2},
                    "notes": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["lead"],
                "additionalProperties": False,
            },
            "at": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}], "default": None},
            "seat": {"type": "string", "enum": ["inside", "terrace"], "default": "inside"},
        },
        "required": ["day", "meal", "party"],
        "additionalProperties": False,
    }
    assert tool.arguments is not None
    checked = tool.arguments.check({"day": "2027-01-05", "meal": "dinner", "party": {"lead": "Ada"}})
    assert checked == {
        "day": datetime.date(2027, 1, 5),
        "meal": Meal.dinner,
        "party": Party(lead="Ada", size=2, notes=[]),
        "at": None,
        "seat": "inside",
    }


def test_arguments_that_do_not_fit_are_refused_each_one_named() -> None:
    agent = Agent("a")

    @agent.tool
    def reserve(ctx: Context, meal: Meal, party: Party) -> str:
        """Reserve a table."""
        return "ok"

    assert agent.tools[0].arguments is not None
    with pytest.raises(ArgumentsRefused) as excinfo:
        agent.tools[0].arguments.check({"meal": "lunch", "party": {"size": "x"}, "extra": 1})
    message = str(excinfo.value)
    assert message.startswith("invalid arguments: ")
    for where in ("meal", "party.lead", "party.size", "extra"):
        assert f"{where}: " in message, where


def test_a_class_that_contains_itself_cannot_be_a_tool_parameter() -> None:
    agent = Agent("a")
    with pytest.raises(AuthoringError) as excinfo:

        @agent.tool
        def walk(ctx: Context, node: Node) -> str:
            """Walk a tree."""
            return ""

    assert "Node refers to itself" in _authoring_error(excinfo)


@attrs.frozen
class Node:
    children: list[Node]
