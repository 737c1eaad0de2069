"""The deterministic local model: a rule-based stand-in for an LLM that needs no network.

It is **not a language model**. It follows a few fixed rules over the conversation and the
tools it is offered, so the runner, its tests and its benchmarks can hold real conversations
(greetings, tool calls, answers) with no model service and with repeatable results.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import attrs
import trio

from ._types import ChatMessage, LLMEvent, TextDelta, ThoughtDelta, ToolCall, ToolSpec, Usage

FIXED_GREETING = "Hello! How can I help you today?"

_STOP_WORDS = frozenset(
    """
    a about after all also am an and any are as at be been being but by can could did do does doing
    for from get got had has have having he her here him his how i if in into is it its just let
    like me mine more most my no not now of on or our out over please say set she should so some
    tell than that the their them then there these they this those to too up us very want was we
    were what when where which who whom why will with would yes you your yours
    """.split()
)
_NEGATIONS = frozenset({"no", "not", "never", "don't", "dont", "doesn't", "isn't", "without"})
_GREETING = re.compile(
    r"(hello|hi|hey|welcome|greetings|good (morning|afternoon|evening|day))\b", re.IGNORECASE
)
_NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[A-Za-z0-9][A-Za-z0-9'_-]*|[.,;:!?]")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _stem(word: str) -> str:
    word = word.lower()
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _content_stems(text: str) -> set[str]:
    stems = (_stem(t) for t in re.findall(r"[a-z0-9']+", text.lower()))
    return {s for s in stems if s not in _STOP_WORDS and len(s) > 1}


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def _words(text: str) -> int:
    return len(text.split())


@attrs.frozen
class _Token:
    raw: str
    stem: str
    is_word: bool


def _tokens(text: str) -> list[_Token]:
    return [
        _Token(raw=m.group(), stem=_stem(m.group()), is_word=m.group()[0].isalnum())
        for m in _TOKEN.finditer(text)
    ]


def _phrase_after(tokens: Sequence[_Token], index: int) -> str:
    """The words after ``tokens[index]``: past any stop words, up to the next stop word or
    punctuation ("weather *in* Paris *for* 3 days" gives "Paris")."""
    rest = list(tokens[index + 1 :])
    while rest and rest[0].is_word and rest[0].raw.lower() in _STOP_WORDS:
        rest.pop(0)
    run: list[str] = []
    for token in rest:
        if not token.is_word or token.raw.lower() in _STOP_WORDS:
            break
        run.append(token.raw)
    return " ".join(run)


def _find(tokens: Sequence[_Token], stems: Sequence[str]) -> int | None:
    """Index of the last token of the first place ``stems`` occur in a row, if any."""
    if not stems:
        return None
    width = len(stems)
    for start in range(len(tokens) - width + 1):
        if all(tokens[start + k].stem == stems[k] for k in range(width)):
            return start + width - 1
    return None


@attrs.frozen
class _Match:
    tool: ToolSpec
    score: int
    keyword_index: int


def _name_words(name: str) -> list[str]:
    return [_stem(w) for w in re.split(r"[_\-\s]+", name) if w]


def _match_tool(tools: Sequence[ToolSpec], tokens: Sequence[_Token]) -> _Match | None:
    """The offered tool the text speaks of most: its whole name, a word of its name, or a
    keyword of its description (earlier tools win ties)."""
    best: _Match | None = None
    for tool in tools:
        score = 0
        where: int | None = None
        whole = _find(tokens, [_stem(tool.name)])
        if whole is None:
            whole = _find(tokens, _name_words(tool.name))
        if whole is not None:
            score, where = 100, whole
        for word in _name_words(tool.name):
            if word in _STOP_WORDS or len(word) < 3:
                continue
            found = _find(tokens, [word])
            if found is not None:
                score += 10
                where = found if where is None else where
        by_name = where is not None
        for word in sorted(_content_stems(tool.description)):
            if len(word) < 4:
                continue
            found = _find(tokens, [word])
            if found is not None:
                score += 1
                if not by_name:
                    where = found if where is None else min(where, found)
        if where is not None and (best is None or score > best.score):
            best = _Match(tool=tool, score=score, keyword_index=where)
    return best


def _numbers(tokens: Sequence[_Token], taken: set[str]) -> list[float]:
    """Numbers the text spells, digits or words, in order, skipping ones used as strings."""
    found: list[float] = []
    for token in tokens:
        raw = token.raw.lower()
        if raw in taken:
            continue
        if _NUMBER.fullmatch(raw):
            found.append(float(raw))
        elif raw in _NUMBER_WORDS:
            found.append(float(_NUMBER_WORDS[raw]))
    return found


def _string_argument(
    name: str, schema: Mapping[str, Any], tokens: Sequence[_Token], keyword_index: int, text: str
) -> str:
    enum = [e for e in schema.get("enum", ()) if isinstance(e, str)]
    if enum:
        stems = {t.stem for t in tokens}
        return next((e for e in enum if _stem(e) in stems), enum[0])
    at = _find(tokens, _name_words(name))
    for index in (at, keyword_index):
        if index is not None:
            phrase = _phrase_after(tokens, index)
            if phrase:
                return phrase
    return text.strip().rstrip(".!?").strip()


def _arguments(tool: ToolSpec, text: str, keyword_index: int) -> dict[str, Any]:
    """Fill each required parameter from the user's text."""
    schema = tool.parameters
    properties = schema.get("properties") or {}
    required = [r for r in schema.get("required") or () if isinstance(r, str)]
    tokens = _tokens(text)
    negated = any(t.raw.lower() in _NEGATIONS for t in tokens)
    kinds: dict[str, str] = {}
    for name in required:
        prop = properties.get(name) or {}
        kind = prop.get("type", "string") if isinstance(prop, Mapping) else "string"
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        kinds[name] = kind if isinstance(kind, str) else "string"
    arguments: dict[str, Any] = {}
    for name, kind in kinds.items():
        if kind not in ("integer", "number", "boolean", "array", "object"):
            prop = properties.get(name) or {}
            prop = prop if isinstance(prop, Mapping) else {}
            arguments[name] = _string_argument(name, prop, tokens, keyword_index, text)
    taken = {str(v).lower() for v in arguments.values()}
    numbers = iter(_numbers(tokens, taken))
    for name, kind in kinds.items():
        prop = properties.get(name) or {}
        prop = prop if isinstance(prop, Mapping) else {}
        if kind in ("integer", "number"):
            value = next(numbers, None)
            if value is None:
                fallback = prop.get("default", prop.get("minimum", 0))
                value = float(fallback) if isinstance(fallback, (int, float)) else 0.0
            arguments[name] = int(value) if kind == "integer" or value.is_integer() else value
        elif kind == "boolean":
            arguments[name] = not negated
        elif kind == "array":
            arguments[name] = []
        elif kind == "object":
            arguments[name] = {}
    return {name: arguments[name] for name in kinds}


def _greeting(instructions: str) -> str:
    sentences = _sentences(instructions)
    if not sentences or not _GREETING.match(sentences[0]):
        return FIXED_GREETING
    if len(sentences[0].split()) <= 2 and len(sentences) > 1:  # "Hi! I am Bo." stays whole
        return f"{sentences[0]} {sentences[1]}"
    return sentences[0]


def _with_stop(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def _tool_answer(messages: Sequence[ChatMessage]) -> str:
    results: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.append(message)
    results.reverse()
    names = {
        call.id: call.name
        for message in messages
        if message.role == "assistant"
        for call in message.tool_calls
    }
    parts = []
    for result in results:
        if result.content.strip():
            parts.append(_with_stop(result.content))
        else:
            name = names.get(result.tool_call_id or "", "the tool")
            parts.append(f"{name} returned nothing.")
    return "Here is what I found: " + " ".join(parts)


def _answer(instructions: str, text: str) -> tuple[str, str]:
    """The answer, and why (the thinking summary)."""
    wanted = _content_stems(text)
    best, best_overlap = "", 0
    for sentence in _sentences(instructions):
        shared = wanted & _content_stems(sentence)
        if len(shared) > best_overlap:
            best, best_overlap = sentence, len(shared)
    if best:
        shared_words = ", ".join(f"'{w}'" for w in sorted(wanted & _content_stems(best)))
        return best, f"The instructions speak of {shared_words}: I answer with that sentence."
    if not text.strip():
        return "Sorry, I didn't catch that.", "I heard no words: I ask again."
    return f"You said: {_with_stop(text)}", "Nothing in the instructions matches: I say back what I heard."


class LocalLLM:
    """The deterministic local model: a rule-based stand-in, **not a language model**.

    It needs no network and answers the same way every time for the same messages and tools:

    * no user message yet (a greeting request): the first sentence of the instructions (the
      system message) if it is a greeting, else ``FIXED_GREETING``;
    * the last message is the user's and names an offered tool (its name, a word of its name
      split on ``_``/``-``, or a keyword of its description): one call of that tool, with each
      required parameter filled from the user's words (strings from the words after the
      parameter's name or the matched keyword, else the whole text; numbers from digits);
    * the last messages are tool results: a sentence quoting the results;
    * otherwise the instruction sentence sharing the most words with the user's text, or
      ``"You said: ..."``.

    Replies stream a few words per ``TextDelta``; ``Usage`` counts whitespace-separated words.

    Thinking summaries: asked with ``stream(..., thoughts=True)``, it first yields one
    ``ThoughtDelta`` naming the rule it followed (e.g. ``"Looking at the tools: weather
    matches 'weather'."``), counted in ``Usage.thought_tokens``. It is a fixed description
    of the rule above, not reasoning: there is no model here to think.

    Args:
        model: The name reported in ``Usage``.
        delay_per_delta_s: Time to wait before each delta, to simulate generation.
        words_per_delta: How many words each ``TextDelta`` carries.
    """

    provider = "local"
    reports_thoughts = True

    def __init__(
        self, model: str = "local", *, delay_per_delta_s: float = 0.0, words_per_delta: int = 3
    ) -> None:
        if delay_per_delta_s < 0:
            raise ValueError("delay_per_delta_s must not be negative")
        if words_per_delta < 1:
            raise ValueError("words_per_delta must be at least 1")
        self.model = model
        self.delay_per_delta_s = delay_per_delta_s
        self.words_per_delta = words_per_delta

    def __repr__(self) -> str:
        return f"LocalLLM(model={self.model!r}, delay_per_delta_s={self.delay_per_delta_s!r})"

    def decide(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> str | ToolCall:
        """The whole reply these inputs get: the text to say, or the one tool to call."""
        return self.explain(messages, tools)[0]

    def explain(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> tuple[str | ToolCall, str]:
        """:meth:`decide`'s reply and one sentence saying which rule gave it (the thinking
        summary ``stream(..., thoughts=True)`` reports)."""
        instructions = "\n".join(m.content for m in messages if m.role == "system")
        users = [m for m in messages if m.role == "user"]
        if not users:
            return _greeting(instructions), "No one has spoken yet: I open with a greeting."
        last = messages[-1]
        if last.role == "tool":
            return _tool_answer(messages), "The tool results are in: I pass them on."
        prefix = ""
        if last.role == "user" and tools:
            tokens = _tokens(last.content)
            match = _match_tool(tools, tokens)
            if match is not None:
                call = ToolCall(
                    id=f"call_local_{len(messages)}",
                    name=match.tool.name,
                    arguments=_arguments(match.tool, last.content, match.keyword_index),
                )
                word = tokens[match.keyword_index].raw
                return call, f"Looking at the tools: {match.tool.name} matches '{word}'."
            prefix = "Looking at the tools: none matches. "
        answer, why = _answer(instructions, users[-1].content)
        return answer, prefix + why

    async def _pause(self) -> None:
        if self.delay_per_delta_s > 0:
            await trio.sleep(self.delay_per_delta_s)
        else:
            await trio.lowlevel.checkpoint()

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        *,
        thoughts: bool = False,
    ) -> AsyncGenerator[LLMEvent, None]:
        """Yield the reply a few words at a time (or the tool call), then one ``Usage``.

        With ``thoughts``, one ``ThoughtDelta`` (the rule followed) comes first.
        """
        input_tokens = sum(_words(m.content) for m in messages)
        reply, why = self.explain(messages, tools)
        thought_tokens = 0
        if thoughts:
            await self._pause()
            thought_tokens = _words(why)
            yield ThoughtDelta(text=why)
        if isinstance(reply, ToolCall):
            await self._pause()
            yield reply
            spoken = " ".join([reply.name, json.dumps(dict(reply.arguments), sort_keys=True)])
            yield Usage(
                model=self.model,
                input_tokens=input_tokens,
                output_tokens=_words(spoken),
                thought_tokens=thought_tokens,
            )
            return
        words = reply.split()
        step = self.words_per_delta
        for start in range(0, len(words), step):
            await self._pause()
            piece = " ".join(words[start : start + step])
            yield TextDelta(text=piece if start + step >= len(words) else piece + " ")
        yield Usage(
            model=self.model,
            input_tokens=input_tokens,
            output_tokens=len(words),
            thought_tokens=thought_tokens,
        )
