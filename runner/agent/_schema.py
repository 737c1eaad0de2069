"""A tool's parameters: the JSON Schema the model is offered, and the check of what it sent.

Both come from one pydantic model made from the tool's signature, so what the model is
told and what is accepted cannot drift apart. Pydantic knows ``Literal``, ``Enum``,
``date``/``datetime``, unions, containers and defaults; this module only tells it two
things it does not know: ``Annotated[T, "text"]`` is a description, and an attrs class is
an object of its fields (built back into the attrs class once checked).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from functools import reduce
from operator import or_
from typing import Annotated, Any, Literal

import attrs
import pydantic

from ._settings import AuthoringError

# Keys of a JSON Schema whose values are data, not schemas (never walked for titles or refs).
_DATA_KEYS = frozenset({"default", "enum", "const", "examples"})


class ArgumentsRefused(ValueError):
    """What the model sent does not fit the tool's parameters; the message says where and why."""


@attrs.frozen
class Parameters:
    """A tool's parameters: ``schema`` for the model, :meth:`check` for what it sends."""

    schema: Mapping[str, Any]
    _model: type[pydantic.BaseModel]

    def check(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments as the tool's Python types (enums, dates, attrs instances).

        Raises:
            ArgumentsRefused: A missing, unknown or ill-typed argument, each one named.
        """
        try:
            checked = self._model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise ArgumentsRefused(f"invalid arguments: {problems}") from None
        return {name: getattr(checked, name) for name in type(checked).model_fields}


def parameters_of(fn: Callable[..., Any], where: str) -> Parameters:
    """The parameters of ``fn(ctx, ...)``: every one after the context, named and annotated.

    Raises:
        AuthoringError: A parameter is positional-only or ``*args``, lacks an annotation,
            or has a type no model can send.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for param in list(inspect.signature(fn).parameters.values())[1:]:
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise AuthoringError(f"{where}: parameter {param.name!r} must be a named parameter")
        if param.name not in hints:
            raise AuthoringError(f"{where}: parameter {param.name!r} needs a type annotation")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (_for_pydantic(hints[param.name], where, ()), default)
    try:
        model = pydantic.create_model("Arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
        schema = model.model_json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        raise AuthoringError(f"{where}: a parameter type cannot be offered to a model: {exc}") from None
    return Parameters(_plain(schema), model)


def _for_pydantic(annotation: Any, where: str, seen: tuple[type, ...]) -> Any:
    """``annotation`` with string metadata as descriptions and attrs classes as models."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        inner, *metadata = typing.get_args(annotation)
        extras = [pydantic.Field(description=m) if isinstance(m, str) else m for m in metadata]
        return Annotated[(_for_pydantic(inner, where, seen), *extras)]
    if isinstance(annotation, type) and attrs.has(annotation):
        return _attrs_model(annotation, where, seen)
    args = typing.get_args(annotation)
    if not args or origin is Literal:
        return annotation
    converted = tuple(_for_pydantic(a, where, seen) for a in args)
    if converted == args:
        return annotation
    if origin in (typing.Union, types.UnionType):
        return reduce(or_, converted)
    return origin[converted if len(converted) > 1 else converted[0]]


def _attrs_model(cls: type, where: str, seen: tuple[type, ...]) -> Any:
    """A pydantic model of an attrs class's fields that checks into an instance of the class."""
    if cls in seen:
        raise AuthoringError(f"{where}: {cls.__name__} refers to itself; a model cannot send it")
    fields: dict[str, Any] = {}
    for field in attrs.fields(attrs.resolve_types(cls, include_extras=True)):
        if not field.init:
            continue
        default: Any = ...
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]  # attrs' stub declares Factory as a function, but at run time it is the class
            if field.default.takes_self:
                raise AuthoringError(f"{where}: {cls.__name__}.{field.name}'s default needs self")
            default = pydantic.Field(default_factory=field.default.factory)
        elif field.default is not attrs.NOTHING:
            default = field.default
        fields[field.alias or field.name] = (_for_pydantic(field.type, where, (*seen, cls)), default)
    model = pydantic.create_model(
        cls.__name__, __config__=pydantic.ConfigDict(extra="forbid"), __doc__=cls.__doc__, **fields
    )

    def build(value: pydantic.BaseModel) -> Any:
        return cls(**{name: getattr(value, name) for name in type(value).model_fields})

    return Annotated[model, pydantic.AfterValidator(build)]


def _plain(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with ``$ref``s inlined and pydantic's generated titles dropped.

    Models and the local model read parameters best self-contained; a title only repeats
    the parameter's name.
    """
    definitions = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = definitions[node["$ref"].rsplit("/", 1)[-1]]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return walk({**target, **rest})
        return {
            key: value
            if key in _DATA_KEYS
            else {name: walk(v) for name, v in value.items()}
            if key == "properties"
            else walk(value)
            for key, value in node.items()
            if key != "$defs" and not (key == "title" and isinstance(value, str))
        }

    out = walk(schema)
    assert isinstance(out, dict)
    return out
