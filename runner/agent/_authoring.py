"""The authoring API: what an agent is made of, checked when it is defined.

The Python counterpart of the seed's ``<Agent>``, ``<Skill>``, ``<Tool>``, ``<Text>`` and
``useMessage``. What an agent offers its model is a function of the call's state
(:meth:`Agent.offer`), recomputed before every turn and after every message handler,
so a handler that changes state can unlock a tool or a skill.
"""

from __future__ import annotations

import inspect
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import attrs

from ..providers import ToolSpec
from ..voice.turn_taking import TurnTaking
from ._schema import Parameters, parameters_of
from ._settings import LLM, STT, TTS, AuthoringError, Origin, check_adjustable

if TYPE_CHECKING:
    from ._context import Context

F = TypeVar("F", bound=Callable[..., Any])
Sender = Literal["client", "host"]
Predicate = Callable[["Context"], bool]
TextSource = str | Callable[["Context"], "str | None"]

MAX_KEY_CHARS = 256

log = logging.getLogger("runner.agent")


@attrs.frozen(kw_only=True)
class Tool:
    """A function the model may call.

    Attributes:
        name: What the model calls it.
        description: What it is for (the docstring by default).
        fn: ``fn(ctx, **arguments)``, sync or async; its return value is the result.
        parameters: The JSON Schema of its arguments, from the signature.
        arguments: Checks what the model sent against the signature (``None``: taken as sent).
        when: Offered only while ``when(ctx)`` holds.
        ask_first: The person must confirm before it runs (``tool.confirm`` on the socket).
        filler: A line spoken while it runs.
    """

    name: str
    description: str
    fn: Callable[..., Any]
    parameters: Mapping[str, Any]
    arguments: Parameters | None = None
    when: Predicate | None = None
    ask_first: bool = False
    filler: str | None = None

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    when: Predicate | None = None,
    ask_first: bool = False,
    filler: str | None = None,
) -> Tool:
    """Build a :class:`Tool` from ``fn(ctx, arg: type, ...)``; its docstring describes it."""
    tool_name = name or fn.__name__
    if not tool_name.replace("_", "").replace("-", "").isalnum() or len(tool_name) > 64:
        raise AuthoringError(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'")
    if not inspect.signature(fn).parameters:
        raise AuthoringError(f"tool {tool_name!r} must take the call context as its first parameter")
    try:
        arguments = parameters_of(fn, f"tool {tool_name!r}")
    except (NameError, TypeError) as exc:
        raise AuthoringError(
            f"tool {tool_name!r}: {_unresolved(fn)}cannot resolve its annotations: {exc}"
        ) from None
    text = description or inspect.getdoc(fn)
    if not text:
        raise AuthoringError(f"tool {tool_name!r} needs a description (a docstring) for the model")
    return Tool(
        name=tool_name,
        description=text,
        fn=fn,
        parameters=arguments.schema,
        arguments=arguments,
        when=when,
        ask_first=ask_first,
        filler=filler,
    )


DEFAULT_APP_TOOL_TIMEOUT_MS = 10_000
MAX_APP_TOOL_TIMEOUT_MS = 600_000


@attrs.frozen(kw_only=True)
class AppTool:
    """A tool the caller's app runs, not the runner (``tool.call`` / ``tool.result`` on the socket).

    Offered to the model only on a connection whose app named it when it connected.

    Attributes:
        name: What the model and the app call it.
        description: What it is for, as the model reads it.
        parameters: The JSON Schema of its arguments.
        action_only: The app just does it: the reply goes on at once and no answer is wanted.
        timeout_ms: How long a call waits for the app's answer before it fails.
        when: Offered only while ``when(ctx)`` holds.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    action_only: bool = False
    timeout_ms: int = DEFAULT_APP_TOOL_TIMEOUT_MS
    when: Predicate | None = None

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)


def _check_tool_name(name: str) -> str:
    if not name or not name.replace("_", "").replace("-", "").isalnum() or len(name) > 64:
        raise AuthoringError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    return name


def _unresolved(fn: Callable[..., Any]) -> str:
    """Which parameter's annotation names nothing, for the error message."""
    for name, annotation in getattr(fn, "__annotations__", {}).items():
        if isinstance(annotation, str):
            try:
                eval(annotation, getattr(fn, "__globals__", {}))
            except Exception:  # noqa: BLE001 - an author's annotation may fail to evaluate in any way
                return f"parameter {name!r}: "
    return ""


@attrs.frozen(kw_only=True)
class MessageHandler:
    """``fn(ctx, payload)`` for messages with ``key`` from ``sender``; ``schema`` decodes the payload."""

    key: str
    sender: Sender
    fn: Callable[..., Any]
    schema: Any = None


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS:
        raise AuthoringError(
            f"a message key must be a string of 1 to {MAX_KEY_CHARS} characters, got {key!r}"
        )
    return key


def _check_sender(sender: object) -> Sender:
    if sender not in ("client", "host"):
        raise AuthoringError(f"a message sender must be 'client' or 'host', got {sender!r}")
    return sender


class _Parts:
    """What agents and skills share: instructions, tools, message handlers."""

    def __init__(self, instructions: TextSource | Sequence[TextSource] | None) -> None:
        if instructions is None:
            self._instructions: list[TextSource] = []
        elif isinstance(instructions, str) or callable(instructions):
            self._instructions = [instructions]
        else:
            self._instructions = list(instructions)
        self.tools: list[Tool] = []
        self.handlers: list[MessageHandler] = []
        self.dtmf_handlers: list[Callable[..., Any]] = []

    def instructions(self, fn: Callable[[Context], str | None]) -> Callable[[Context], str | None]:
        """Decorator: add instructions computed from the call (``None`` adds nothing)."""
        self._instructions.append(fn)
        return fn

    def _texts(self, ctx: Context) -> list[str]:
        out = []
        for source in self._instructions:
            text = source(ctx) if callable(source) else source
            if text:
                out.append(text.strip())
        return out

    def on_message(self, key: str, *, sender: Sender = "client", schema: Any = None) -> Callable[[F], F]:
        """Decorator: handle messages with ``key`` from ``sender`` (``client`` or ``host``).

        The handler is ``fn(ctx, payload)``, sync or async. With ``schema`` (an attrs
        class or any type the converter structures) it gets the decoded payload, and a
        payload that does not decode is refused ``invalid_payload`` before any handler
        runs. Several handlers on one key run in registration order (the agent's, then
        each mounted skill's); the reply is the last one's return value. A skill's
        handlers are live only while the skill is mounted: before, its key is refused
        ``no_handler`` like any key nobody handles.

        Raises:
            AuthoringError: An invalid key or sender.
        """
        check_key(key)
        _check_sender(sender)

        def register(fn: F) -> F:
            self.handlers.append(MessageHandler(key=key, sender=sender, fn=fn, schema=schema))
            return fn

        return register

    def on_dtmf(self, fn: F) -> F:
        """Decorator: handle the keys a phone caller presses (DTMF), one call per key.

        The handler is ``fn(ctx, digit)``, sync or async; ``digit`` is one of ``0``-``9``,
        ``*``, ``#``, ``A``-``D``. Text it returns is spoken to the caller as written (a
        menu's answer, "Thank you, that PIN is right"); ``None`` says nothing. Handlers run
        in registration order (the agent's, then each mounted skill's), one key at a time,
        and not while a transfer target is in the call.
        """
        self.dtmf_handlers.append(fn)
        return fn

    @overload
    def tool(self, fn: F) -> F: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        when: Predicate | None = None,
        ask_first: bool = False,
        filler: str | None = None,
    ) -> Callable[[F], F]: ...

    def tool(self, fn: Any = None, **options: Any) -> Any:
        """Decorator: offer ``fn(ctx, ...)`` to the model as a tool (``when=`` to gate it)."""

        def register(f: F) -> F:
            tool = make_tool(f, **options)
            if any(t.name == tool.name for t in self.tools):
                raise AuthoringError(f"tool {tool.name!r} is defined twice")
            self.tools.append(tool)
            return f

        return register(fn) if fn is not None else register


class Skill(_Parts):
    """A part of an agent that is mounted while ``when(ctx)`` holds.

    A mounted skill adds its instructions and tools to what the model is offered and its
    message handlers to the call's (the seed's ``useMessage`` inside a component: live
    while it is mounted); its ``llm``/``tts``/``stt``, when given, take over from the agent's.
    """

    def __init__(
        self,
        name: str,
        *,
        instructions: TextSource | Sequence[TextSource] | None = None,
        when: Predicate | None = None,
        llm: LLM | None = None,
        tts: TTS | None = None,
        stt: STT | None = None,
    ) -> None:
        super().__init__(instructions)
        if not name:
            raise AuthoringError("a skill needs a name")
        self.name = name
        self.when = when
        self.llm = llm
        self.tts = tts
        self.stt = stt


@attrs.frozen(kw_only=True)
class Offer:
    """What the model is offered right now, and the providers the props pick."""

    instructions: str
    tools: tuple[Tool, ...]
    skills: tuple[str, ...]
    llm: LLM
    tts: TTS | None
    stt: STT | None
    app_tools: tuple[AppTool, ...] = ()

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def app_tool(self, name: str) -> AppTool | None:
        return next((t for t in self.app_tools if t.name == name), None)


RESUME_LINE = "Sorry, the line dropped for a moment. I'm back."
"""What an agent says by default when it picks up a call its runner dropped."""


class Agent(_Parts):
    """A voice agent.

    Args:
        name: Shown in logs and records.
        instructions: Text, or functions of the call giving text, that tell the model who it is.
        llm: The chat model. ``LLM("local", "local")`` (the default) needs no network.
        tts: The voice; ``None`` for a text-only agent.
        stt: The recognizer; ``None`` for an agent that only reads.
        greeting: The opening line: text (spoken as written, no model call), a function
            of the call giving text, ``True`` to let the model open, or ``None`` to wait.
        adjustable: Per origin (``client``, ``host``), the settings paths it may change
            during a call: ``tts.voice``, ``tts.model``, ``stt.language``, ``llm``.
        experiments: Experiment name to ``{variant: weight}``; a call reads its variant as
            ``ctx.experiment.<name>``.
        from_client: Per experiment, a client context key whose value may pick the variant.
        state: Makes each call's mutable state, read and changed as ``ctx.state``.
        skills: Skills to mount while their ``when`` holds.
        max_tool_rounds: Model calls per turn that may end in tool calls.
        knowledge: How the agent uses its knowledge entries on the agent WebSocket:
            ``"first"`` searches them with the person's words before each reply,
            ``"tool"`` offers the model the platform's ``search_knowledge`` tool, ``None``
            uses none.
        moods: Report a mood with every reply (``mood`` on the agent WebSocket).
        relations: Keep a standing relationship with each person (``ready.relation``) and
            offer the model the platform's ``record_relationship`` tool.
        thinking_summaries: ``"auto"``: send the model's thinking summaries to a client that
            asks for them (``thoughts: true``); ``"off"``: never.
        compact_after_words: Compact a conversation into a summary once the words of its
            messages since the last summary pass this budget; ``None``: never.
        vad: How the agent tells the caller's speech from the rest: ``"silero"`` (the
            Silero VAD model, the default) or ``"energy"`` (frame energy, the light option).
        turn_detection: How the agent finds the end of the caller's turn: ``"smart_turn"``
            (the default: the end-of-turn model judges each pause, docs/speech.md) or
            ``"silence"`` (``end_of_turn_silence_ms`` of quiet ends every turn).
        end_of_turn_silence_ms: The fixed rule's silence (also the rule when the end-of-turn
            model is not installed).
        min_end_of_turn_silence_ms: With the model: the quiet after which a pause it judges
            finished ends the turn.
        max_end_of_turn_silence_ms: With the model: the longest pause; the turn ends then,
            whatever it judged.
        backchannels: Speech over the agent's voice holds it and is judged by its words: a
            backchannel ("mm-hm", "yeah") or no words lets it go on where it was, anything
            else cuts it off. ``False``: any speech cuts it off at once.
        end_of_turn_silence_ms: How long the caller must be quiet before their turn ends.
        resume_line: What the agent says first when it picks up a call whose runner died
            (a start with ``resume``, docs/failover.md), in place of the greeting: text, a
            function of the call giving text (``ctx.call.history`` holds the conversation so
            far), ``True`` to let the model speak first, or ``None`` to wait for the caller.
    """

    def __init__(
        self,
        name: str,
        *,
        instructions: TextSource | Sequence[TextSource] | None = None,
        llm: LLM | None = None,
        tts: TTS | None = None,
        stt: STT | None = None,
        greeting: TextSource | bool | None = None,
        adjustable: dict[str, list[str]] | None = None,
        experiments: Mapping[str, Mapping[str, int]] | None = None,
        from_client: Mapping[str, str] | None = None,
        state: Callable[[], Any] | None = None,
        skills: Sequence[Skill] = (),
        max_tool_rounds: int = 4,
        knowledge: Literal["first", "tool"] | None = None,
        moods: bool = False,
        relations: bool = False,
        thinking_summaries: Literal["auto", "off"] = "off",
        compact_after_words: int | None = None,
        vad: Literal["silero", "energy"] = "silero",
        turn_detection: Literal["smart_turn", "silence"] = "smart_turn",
        end_of_turn_silence_ms: int = 500,
        min_end_of_turn_silence_ms: int = 200,
        max_end_of_turn_silence_ms: int = 2000,
        backchannels: bool = True,
        resume_line: TextSource | bool | None = RESUME_LINE,
    ) -> None:
        super().__init__(instructions)
        if not name:
            raise AuthoringError("an agent needs a name")
        if vad not in ("silero", "energy"):
            raise AuthoringError("vad must be 'silero' or 'energy'")
        try:
            self.turn_taking = TurnTaking(
                detection=turn_detection,
                silence_ms=end_of_turn_silence_ms,
                min_silence_ms=min_end_of_turn_silence_ms,
                max_silence_ms=max_end_of_turn_silence_ms,
                backchannels=backchannels,
            )
        except ValueError as exc:
            raise AuthoringError(str(exc)) from None
        self.vad = vad
        self.end_of_turn_silence_ms = end_of_turn_silence_ms
        if knowledge not in (None, "first", "tool"):
            raise AuthoringError("knowledge must be 'first', 'tool' or None")
        if thinking_summaries not in ("auto", "off"):
            raise AuthoringError("thinking_summaries must be 'auto' or 'off'")
        if compact_after_words is not None and compact_after_words < 1:
            raise AuthoringError("compact_after_words must be at least 1")
        self.knowledge = knowledge
        self.moods = moods
        self.relations = relations
        self.thinking_summaries = thinking_summaries
        self.compact_after_words = compact_after_words
        self.name = name
        self.llm = llm or LLM(provider="local", model="local")
        self.tts = tts
        self.stt = stt
        self.greeting = greeting
        self.resume_line = resume_line
        self.adjustable: dict[Origin, tuple[str, ...]] = check_adjustable(adjustable)
        self.experiments = {k: dict(v) for k, v in (experiments or {}).items()}
        for experiment, weights in self.experiments.items():
            if not weights or any(not isinstance(w, int) or w < 0 for w in weights.values()):
                raise AuthoringError(
                    f"experiment {experiment!r} needs variants with non-negative integer weights"
                )
            if sum(weights.values()) <= 0:
                raise AuthoringError(f"experiment {experiment!r} needs a positive total weight")
        self.from_client = dict(from_client or {})
        self.state_factory = state or dict
        self.skills = list(skills)
        if max_tool_rounds < 0:
            raise AuthoringError("max_tool_rounds must be at least 0")
        self.max_tool_rounds = max_tool_rounds
        self.app_tools: list[AppTool] = []

    def app_tool(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        action_only: bool = False,
        timeout_ms: int = DEFAULT_APP_TOOL_TIMEOUT_MS,
        when: Predicate | None = None,
    ) -> AppTool:
        """Declare a tool the caller's app runs (see :class:`AppTool`).

        The model is offered it only on a connection whose app named it; the app gets
        ``tool.call`` and answers ``tool.result`` within ``timeout_ms``.

        Raises:
            AuthoringError: A bad name, a name already used, or a timeout out of range.
        """
        _check_tool_name(name)
        if any(t.name == name for t in self.tools) or any(t.name == name for t in self.app_tools):
            raise AuthoringError(f"tool {name!r} is defined twice")
        if not description:
            raise AuthoringError(f"app tool {name!r} needs a description for the model")
        if not isinstance(timeout_ms, int) or not 1 <= timeout_ms <= MAX_APP_TOOL_TIMEOUT_MS:
            raise AuthoringError(f"app tool {name!r}: timeout_ms must be 1 to {MAX_APP_TOOL_TIMEOUT_MS}")
        schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
        if schema.get("type") != "object":
            raise AuthoringError(f"app tool {name!r}: parameters must be a JSON Schema of type object")
        tool = AppTool(
            name=name,
            description=description,
            parameters=schema,
            action_only=action_only,
            timeout_ms=timeout_ms,
            when=when,
        )
        self.app_tools.append(tool)
        return tool

    def skill(self, skill: Skill) -> Skill:
        """Add a skill (also usable as ``agent.skill(Skill(...))``)."""
        self.skills.append(skill)
        return skill

    def handlers_for(self, key: str, sender: Sender, ctx: Context | None = None) -> list[MessageHandler]:
        """The handlers of ``key`` from ``sender``: the agent's, then each mounted skill's.

        With no ``ctx``, only the agent's own (a skill's are live only while it is mounted).
        """
        own = [h for h in self.handlers if h.key == key and h.sender == sender]
        if ctx is None:
            return own
        for skill in self.mounted(ctx):
            own.extend(h for h in skill.handlers if h.key == key and h.sender == sender)
        return own

    def dtmf_handlers_for(self, ctx: Context) -> list[Callable[..., Any]]:
        """The key handlers live now: the agent's, then each mounted skill's."""
        return [*self.dtmf_handlers, *(fn for skill in self.mounted(ctx) for fn in skill.dtmf_handlers)]

    def mounted(self, ctx: Context) -> list[Skill]:
        """The skills mounted for this call's state right now."""
        return [s for s in self.skills if s.when is None or s.when(ctx)]

    def offer(self, ctx: Context) -> Offer:
        """What the model is offered for this call's state right now."""
        mounted = self.mounted(ctx)
        texts = self._texts(ctx)
        tools = [t for t in self.tools if t.when is None or t.when(ctx)]
        llm, tts, stt = self.llm, self.tts, self.stt
        for skill in mounted:
            texts.extend(skill._texts(ctx))
            tools.extend(t for t in skill.tools if t.when is None or t.when(ctx))
            llm = skill.llm or llm
            tts = skill.tts or tts
            stt = skill.stt or stt
        return Offer(
            instructions="\n\n".join(texts),
            tools=tuple(tools),
            skills=tuple(s.name for s in mounted),
            llm=llm,
            tts=tts,
            stt=stt,
            app_tools=tuple(t for t in self.app_tools if t.when is None or t.when(ctx)),
        )


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call agent code that may be sync or async."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def log_tool_failure(name: str, error: BaseException) -> None:
    """Say on the log that an author's tool raised: where (its innermost frame) always, and at
    ``debug`` the whole traceback, so the author finds the line without a debugger."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    log.warning(
        "tool %s failed: %s: %s%s",
        name,
        type(error).__name__,
        error,
        where,
        exc_info=error if log.isEnabledFor(logging.DEBUG) else None,
    )
