"""OpenTelemetry tracing, off unless configured: a span per call, a child per turn, and a
child of the turn for each provider request (STT, model, TTS).

Only ``opentelemetry-api`` is a dependency. The SDK is imported only when the standard
``OTEL_*`` variables name an exporter (:func:`configure_tracing_from_env`), or when a test
hands :func:`configure_tracing` a provider of its own. Off, every helper here returns at
once without touching OpenTelemetry.

:class:`Stage` is the one instrument around a provider request: it times the request's
first output (for the latency histograms), counts a provider error by provider and code,
and, with tracing on, is the request's span.
"""

from __future__ import annotations

import contextvars
import importlib
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._metrics import Metrics, current_metrics

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

_tracer: Tracer | None = None

TRACER_NAME = "curb-runner"


def configure_tracing(provider: Any | None) -> None:
    """Trace through ``provider`` (an SDK ``TracerProvider``); ``None`` turns tracing off."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer(TRACER_NAME)


def tracing_enabled() -> bool:
    return _tracer is not None


def configure_tracing_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """Turn tracing on when ``OTEL_TRACES_EXPORTER`` (or an OTLP endpoint) is set.

    ``console`` prints spans on stdout; ``otlp`` (the default once an endpoint is set) needs
    the ``opentelemetry-exporter-otlp-proto-http`` package. ``OTEL_SERVICE_NAME`` and the
    other standard variables are read by the SDK itself.

    Returns:
        The exporter's name, or ``None`` when tracing stays off.

    Raises:
        ValueError: An exporter this runner cannot load (the message names what to install).
    """
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not exporter_name:
        exporter_name = "otlp" if endpoint else "none"
    if exporter_name == "none" or environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={exporter_name} needs the OpenTelemetry SDK: "
            "pip install 'curb-runner[tracing]'"
        ) from None
    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            # Optional (the tracing extra): looked up by name, so the checkers need not have it.
            otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        except ImportError:
            raise ValueError(
                "OTEL_TRACES_EXPORTER=otlp needs the opentelemetry-exporter-otlp-proto-http package"
            ) from None
        exporter = otlp.OTLPSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER must be otlp, console or none, got {exporter_name!r}")
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": TRACER_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    configure_tracing(provider)
    return exporter_name


# The trace context spans start under: the call's, then within a turn the turn's. Our own
# context variable, set once per call and per turn, rather than OpenTelemetry's attach (a
# copy of its context each time): spans cost what the SDK makes them cost, and no more.
_parent: contextvars.ContextVar[Any] = contextvars.ContextVar("curb_trace_parent", default=None)


def start_span(
    name: str, attributes: Mapping[str, Any], *, parent: Span | None = None, start_ns: int | None = None
) -> Span | None:
    """A span under ``parent`` (else the current call's or turn's); ``None`` with tracing off.

    End it yourself.
    """
    tracer = _tracer
    if tracer is None:
        return None
    if parent is not None:
        from opentelemetry import trace

        context = trace.set_span_in_context(parent)
    else:
        context = _parent.get()
    return tracer.start_span(name, context=context, attributes=attributes, start_time=start_ns)


def enter_span(span: Span | None) -> object:
    """Start this task's (and its new tasks') spans under ``span``; undo with :func:`exit_span`."""
    if span is None:
        return None
    from opentelemetry import trace

    return _parent.set(trace.set_span_in_context(span))


def exit_span(token: object) -> None:
    if token is not None:
        _parent.reset(token)  # type: ignore[arg-type]  # the token is the Token enter_span returned, carried as object so callers need not import contextvars


def current_span() -> Span | None:
    """The span this task's spans start under (``None`` with tracing off, or outside a call)."""
    context = _parent.get()
    if _tracer is None or context is None:
        return None
    from opentelemetry import trace

    return trace.get_current_span(context)


class Stage:
    """One provider request: ``with stage("llm", provider, model) as s: ...; s.first()``.

    Its span's parent is the span current in the task that opened it (the turn).
    It never makes itself current, so it may be held across an async generator's yields.
    """

    __slots__ = ("_began", "_first", "_kind", "_metrics", "_provider", "_span")

    def __init__(self, kind: str, provider: str, model: str | None, metrics: Metrics | None) -> None:
        self._kind = kind
        self._provider = provider
        self._metrics = metrics
        self._first = False
        self._began = time.perf_counter()
        attributes = {"curb.provider": provider, "curb.stage": kind}
        if model:
            attributes["curb.model"] = model
        self._span = start_span(kind, attributes)

    def __enter__(self) -> Stage:
        return self

    def first(self) -> None:
        """The request's first output (text, audio) arrived."""
        if self._first:
            return
        self._first = True
        seconds = time.perf_counter() - self._began
        if self._metrics is not None:
            self._metrics.first_output(self._kind, self._provider, seconds)
        if self._span is not None:
            self._span.set_attribute("curb.first_output_ms", round(seconds * 1000, 3))

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        code = getattr(exc, "code", None) if isinstance(exc, Exception) else None
        if code is not None and self._metrics is not None:
            self._metrics.provider_error(self._provider, str(code))
        span = self._span
        if span is not None:
            if isinstance(exc, Exception):
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, f"{code or type(exc).__name__}: {exc}"))
            span.end()


class _NoStage:
    __slots__ = ()

    def __enter__(self) -> _NoStage:
        return self

    def first(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


_NO_STAGE = _NoStage()


def stage(kind: str, provider: Any) -> Stage | _NoStage:
    """Instrument one request to ``provider`` (its ``provider`` and ``model`` attributes)."""
    metrics = current_metrics()
    if metrics is None and _tracer is None:
        return _NO_STAGE
    return Stage(
        kind, str(getattr(provider, "provider", "unknown")), getattr(provider, "model", None), metrics
    )
