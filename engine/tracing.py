"""OpenTelemetry spans on a private tracer provider, or nothing at all when no endpoint is configured.

Span names in use: `http.request`, `admission` (`admission.background` for a batch line), `adapter.load`,
`engine.generate`, `stream`; in scale-out mode each engine replica adds `replica.generate`, a child of the server's
span across the Ray hop (`carrier`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

TRACES_PATH = "/v1/traces"


class _NoopSpan:
    """Stands in for both the context manager and the span when tracing is off; one shared instance."""

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def record_exception(self, exception: BaseException) -> None:
        pass


NOOP_SPAN = _NoopSpan()


def traces_url(endpoint: str) -> str:
    """A collector base URL ("http://host:4318") gets the OTLP/HTTP traces path; a URL with a path is kept."""
    return endpoint.rstrip("/") + TRACES_PATH if urlsplit(endpoint).path in ("", "/") else endpoint


class Tracing:
    """`span(name, **attrs)` opens a span nested under the current one (contextvars, so asyncio tasks too).

    `endpoint` is an OTLP/HTTP collector; `exporter` replaces it (tests pass an in-memory one). With neither,
    tracing is off and `span` returns a shared no-op object: no OpenTelemetry SDK is imported.
    """

    def __init__(self, endpoint: str | None, service_name: str = "loraplex", exporter: SpanExporter | None = None):
        self.enabled = endpoint is not None or exporter is not None
        self._provider = None
        self._tracer = None
        if not self.enabled:
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        # Private provider: the process-wide one stays untouched, so libraries and tests cannot collide on it.
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("loraplex")

    def span(self, name: str, *, carrier: Mapping[str, str] | None = None, parent: Any = None,
             **attrs: Any) -> AbstractContextManager[Any]:
        """`carrier`: incoming headers whose W3C `traceparent` becomes the parent; `parent`: an OpenTelemetry
        context captured earlier (see `traced`). Otherwise the current span is the parent. None-valued attrs are
        dropped."""
        if self._tracer is None:
            return NOOP_SPAN
        context = parent
        if carrier is not None:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            context = TraceContextTextMapPropagator().extract(carrier)
        attributes = {k: v for k, v in attrs.items() if v is not None}
        return self._tracer.start_as_current_span(name, context=context, attributes=attributes)

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        return self._provider.force_flush(timeout_ms) if self._provider is not None else True

    def shutdown(self) -> None:
        """Flushes pending spans; the object traces nothing afterwards."""
        if self._provider is not None:
            self._provider.shutdown()
            self._provider = None
            self._tracer = None
            self.enabled = False


def carrier() -> dict[str, str]:
    """The current span as W3C trace context headers (`traceparent`), for a call to another process; empty when
    no span is recording."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers)
    return headers


Item = TypeVar("Item")


def traced(items: AsyncIterator[Item], tracing: Tracing, name: str, **attrs: str) -> AsyncIterator[Item]:
    """`items`, inside one span from the first item asked for to the last, a child of the span current *here*: a
    streamed response is iterated after its route returned, outside the request's span. Without tracing, `items`
    itself: no extra generator hop per engine step."""
    if not tracing.enabled:
        return items
    from opentelemetry import context

    return _traced(items, tracing, name, attrs, context.get_current())


async def _traced(items: AsyncIterator[Item], tracing: Tracing, name: str, attrs: dict[str, str],
                  parent: Any) -> AsyncIterator[Item]:
    with tracing.span(name, parent=parent, **attrs) as span:
        count = 0
        async for item in items:
            count += 1
            yield item
        span.set_attribute("items", count)
