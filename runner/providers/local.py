"""The deterministic local model: a rule-based stand-in for an LLM that needs no network.

It is **not a language model**. It follows a few fixed rules over the conversation and the
tools it is offered, so the runner, its tests and its benchmarks can hold real conversations
(greetings, tool calls, answers) with no model service and with repeatable results.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import attrs
import trio

from ._registry import ChatModelProvider
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
# A decimal number, else a word (letters, digits, ``'_-``: "A-1734", "88-123", "10115"), else punctuation.
_TOKEN = re.compile(r"\d+\.\d+|[A-Za-z0-9][A-Za-z0-9'_-]*|[.,;:!?]")
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


def _phrase_after(tokens: Sequence[_Token], index: int, skip: AbstractSet[int] = frozenset()) -> str:
    """The words after ``tokens[index]``: past any stop words, up to the next stop word or
    punctuation, leaving out tokens other parameters took ("weather *in* Paris *for* 3 days"
    gives "Paris")."""
    rest = [(i, t) for i, t in enumerate(tokens) if i > index and i not in skip]
    # "Room service: soup" -- a colon or comma right after the keyword introduces the value.
    while rest and (
        rest[0][1].raw in ":,;" or (rest[0][1].is_word and rest[0][1].raw.lower() in _STOP_WORDS)
    ):
        rest.pop(0)
    run: list[str] = []
    for _, token in rest:
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


def _match_tools(tools: Sequence[ToolSpec], tokens: Sequence[_Token]) -> list[_Match]:
    """The offered tools the text speaks of, most first: by their whole name, a word of
    their name, or a keyword of their description (earlier tools first on a tie)."""
    found_tools: list[_Match] = []
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
        if where is not None:
            found_tools.append(_Match(tool=tool, score=score, keyword_index=where))
    return sorted(found_tools, key=lambda m: -m.score)


#: Words in a string parameter's name that make it a code: filled from a token with a digit.
_CODE_WORDS = frozenset(
    {"postcode", "zip", "zipcode", "postal", "plz", "code", "id", "number", "phone", "ref", "reference"}
)
#: A token that can be a code: a postcode, an order id (``A-1734``), a phone number.
_CODE = re.compile(r"[A-Za-z0-9-]*\d[A-Za-z0-9-]*")


def _number(token: _Token) -> float | None:
    raw = token.raw.lower()
    if _NUMBER.fullmatch(raw):
        return float(raw)
    return float(_NUMBER_WORDS[raw]) if raw in _NUMBER_WORDS else None


def _mentions(tokens: Sequence[_Token], name: str) -> list[int]:
    """Where a word of the parameter's name occurs (``delivery_postcode``: "postcode")."""
    words = {w for w in _name_words(name) if w not in _STOP_WORDS}
    return [i for i, t in enumerate(tokens) if t.stem in words]


def _near(tokens: Sequence[_Token], index: int, fits: Any, taken: set[int]) -> int | None:
    """A token that fits right after ``tokens[index]`` (past stop words), else right before it."""
    after = index + 1
    while after < len(tokens) and tokens[after].raw.lower() in _STOP_WORDS:
        after += 1
    for at in (after, index - 1):
        if 0 <= at < len(tokens) and at not in taken and fits(tokens[at]):
            return at
    return None


def _prop_type(prop: Mapping[str, Any]) -> str:
    kind = prop.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return kind if isinstance(kind, str) else "string"


class _Filler:
    """Fills a tool's parameters from the user's words, by type; a value not found stays out."""

    def __init__(self, tool: ToolSpec, text: str, keyword_index: int) -> None:
        schema = tool.parameters
        properties = schema.get("properties") or {}
        self.props = {n: p for n, p in properties.items() if isinstance(p, Mapping)}
        self.required = [r for r in schema.get("required") or () if isinstance(r, str)]
        self.tokens = _tokens(text)
        self.keyword_index = keyword_index
        self.taken: set[int] = {keyword_index}
        self.values: dict[str, Any] = {}

    def fill(self) -> dict[str, Any]:
        # Most particular first: choices named, codes, numbers; then free text from what is left.
        for name, prop in self.props.items():
            if isinstance(prop.get("enum"), list):
                self._enum(name, prop["enum"])
        for name, prop in self.props.items():
            if name not in self.values and _prop_type(prop) == "string" and self._is_code(name, prop):
                self._code(name, prop)
        for name, prop in self.props.items():
            if name not in self.values and _prop_type(prop) in ("integer", "number"):
                self._number(name, _prop_type(prop))
        negated = any(t.raw.lower() in _NEGATIONS for t in self.tokens)
        for name in self.required:
            prop = self.props.get(name, {})
            kind = _prop_type(prop)
            if name in self.values:
                continue
            if kind == "string" and not self._is_code(name, prop) and "enum" not in prop:
                self._text(name)
            elif kind == "boolean":
                self.values[name] = not negated
        order = list(self.props)
        return {
            n: self.values[n]
            for n in sorted(self.values, key=lambda n: (n not in order, order.index(n) if n in order else 0))
        }

    def missing(self) -> list[str]:
        return [n for n in self.required if n not in self.values]

    @staticmethod
    def _is_code(name: str, prop: Mapping[str, Any]) -> bool:
        return "pattern" in prop or bool(set(_name_words(name)) & _CODE_WORDS)

    def _enum(self, name: str, choices: list[Any]) -> None:
        for i, token in enumerate(self.tokens):
            for choice in choices:
                if isinstance(choice, str) and i not in self.taken and token.stem == _stem(choice):
                    self.values[name] = choice
                    self.taken.add(i)
                    return

    def _code(self, name: str, prop: Mapping[str, Any]) -> None:
        pattern = prop.get("pattern")
        try:
            shape = re.compile(pattern) if isinstance(pattern, str) else _CODE
        except re.error:
            shape = _CODE

        def fits(token: _Token) -> bool:
            return (
                token.is_word
                and bool(shape.fullmatch(token.raw))
                and bool(re.search(r"\d", token.raw) or pattern)
            )

        found = next(
            (
                a
                for m in _mentions(self.tokens, name)
                if (a := _near(self.tokens, m, fits, self.taken)) is not None
            ),
            None,
        )
        if found is None:
            # Not beside its name: a token long enough to be a code, not a count ("2 pizzas").
            found = next(
                (i for i, t in enumerate(self.tokens) if i not in self.taken and len(t.raw) >= 3 and fits(t)),
                None,
            )
        if found is not None:
            self.values[name] = self.tokens[found].raw
            self.taken.add(found)

    def _number(self, name: str, kind: str) -> None:
        def fits(token: _Token) -> bool:
            return _number(token) is not None

        # A number beside the parameter's name ("3 pizzas", "days: 3"); for a required one, else
        # the first number nobody took.
        found = next(
            (
                a
                for m in _mentions(self.tokens, name)
                if (a := _near(self.tokens, m, fits, self.taken)) is not None
            ),
            None,
        )
        if found is None and name in self.required:
            found = next((i for i, t in enumerate(self.tokens) if i not in self.taken and fits(t)), None)
        if found is not None:
            value = _number(self.tokens[found])
            assert value is not None
            self.values[name] = int(value) if kind == "integer" or value.is_integer() else value
            self.taken.add(found)

    def _text(self, name: str) -> None:
        for index in (*_mentions(self.tokens, name), self.keyword_index):
            skip = self.taken - {index}
            phrase = _phrase_after(self.tokens, index, skip)
            if phrase:
                self.values[name] = phrase
                words = phrase.split()
                for i, token in enumerate(self.tokens):
                    if i > index and i not in skip and words and token.raw == words[0]:
                        self.taken.update(range(i, i + len(words)))
                        break
                return


def _arguments(tool: ToolSpec, text: str, keyword_index: int) -> tuple[dict[str, Any], list[str]]:
    """The arguments the user's words give, and the required parameters they do not."""
    filler = _Filler(tool, text, keyword_index)
    return filler.fill(), filler.missing()


def _action(tool: ToolSpec) -> str:
    """What the tool does, to say: its description's first sentence, else its name's words."""
    first = _sentences(tool.description)[0].rstrip(".!?") if tool.description.strip() else ""
    if not first:
        return " ".join(w for w in re.split(r"[_\-\s]+", tool.name) if w).lower()
    return first[0].lower() + first[1:] if first[1:2].islower() else first


def _ask_for(tool: ToolSpec, missing: Sequence[str]) -> str:
    """The question for the parameters the user's words did not give."""
    props = tool.parameters.get("properties") or {}
    parts = []
    choices: list[str] = []
    for name in missing:
        prop = props.get(name) if isinstance(props.get(name), Mapping) else {}
        label = "the " + " ".join(w for w in re.split(r"[_\-\s]+", name) if w).lower()
        about = prop.get("description") if isinstance(prop, Mapping) else None
        parts.append(
            f"{label} ({about[0].lower() + about[1:]})" if isinstance(about, str) and about else label
        )
        enum = prop.get("enum") if isinstance(prop, Mapping) else None
        if isinstance(enum, list) and len(missing) == 1:
            choices = [str(e) for e in enum]
    needed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    if choices:
        question = (
            "Which one: "
            + (choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1])
            + "?"
        )
    else:
        question = "What is it?" if len(missing) == 1 else "What are they?"
    return f"To {_action(tool)}, I need {needed}. {question}"


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


def _words_of(name: str) -> str:
    return " ".join(w for w in re.split(r"[_\-\s]+", name) if w).lower()


def _spoken(value: Any) -> str:
    """A tool's result as words: JSON objects and lists become phrases, never braces."""
    if isinstance(value, Mapping):
        return "; ".join(f"{_words_of(str(k))}: {_spoken(v)}" for k, v in value.items()) or "nothing"
    if isinstance(value, list):
        return ", ".join(_spoken(v) for v in value) or "nothing"
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


#: The exception's type, as a failed tool's error starts (``ValueError: out of dough``).
_ERROR_TYPE = re.compile(r"^[A-Z][A-Za-z0-9_.]*(Error|Exception|Refused|Failed)\w*: ")


def _result_sentence(content: str, name: str) -> str:
    try:
        value = json.loads(content)
    except ValueError:
        value = content
    if isinstance(value, Mapping) and set(value) == {"error"}:
        # A failed call (the pipeline sends {"error": ...}): said plainly, without the type.
        reason = _ERROR_TYPE.sub("", _spoken(value["error"]).strip())
        return _with_stop(f"Sorry, I could not {name}: {reason}" if reason else f"Sorry, I could not {name}")
    if not isinstance(value, (Mapping, list)) and not isinstance(value, str):
        value = content  # a bare number or word reads as written
    spoken = _spoken(value).strip()
    return (
        _with_stop(_capital(spoken))
        if spoken and spoken != "nothing"
        else f"{_capital(name)} returned nothing."
    )


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
    return " ".join(
        _result_sentence(result.content, _words_of(names.get(result.tool_call_id or "", "the tool")))
        for result in results
    )


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
      split on ``_``/``-``, or a keyword of its description; of the tools scored at least
      half the best, the first whose required parameters the words fill): one call of it, its parameters filled from the user's words by
      type (``docs/agents.md``, "The local model"): a choice (``enum``/``Literal``) when one
      of its values is said; a code (a string whose name says postcode, zip, code, id,
      number, phone or ref, or that has a ``pattern``) from a token with a digit, the one
      beside the parameter's name first; a number from the digits or number words beside the
      parameter's name ("3 pizzas"), else (required only) the first one left; other required
      text from the words after the parameter's name or the matched keyword; a required
      boolean true unless the text negates. A required parameter the words do not give is
      not guessed: the model asks for it instead of calling;
    * the last messages are tool results: each result said as words (a JSON object or list
      becomes phrases, never braces; a failed call "Sorry, I could not ...: <reason>");
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
            matches = _match_tools(tools, tokens)
            if matches:
                # Of the tools spoken of about as much as the first, the first the words fill.
                close = [m for m in matches if 2 * m.score >= matches[0].score]
                filled = [(m, *_arguments(m.tool, last.content, m.keyword_index)) for m in close]
                match, arguments, missing = next((f for f in filled if not f[2]), filled[0])
                word = tokens[match.keyword_index].raw
                why = f"Looking at the tools: {match.tool.name} matches '{word}'"
                if missing:
                    return _ask_for(
                        match.tool, missing
                    ), f"{why}, but the words give no {', '.join(missing)}: I ask."
                call = ToolCall(id=f"call_local_{len(messages)}", name=match.tool.name, arguments=arguments)
                return call, why + "."
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


def _build(model: str, *, base_url: str | None, api_key_env: str | None) -> LocalLLM:
    return LocalLLM(model)  # offline: no endpoint, no key


PROVIDES = (ChatModelProvider(name="local", build=_build),)
