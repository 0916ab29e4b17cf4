from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from engine.tracing import NOOP_SPAN, Tracing, carrier, traced, traces_url
from tests.otlp import OtlpCollector


def test_disabled_tracing_is_a_shared_noop():
    tracing = Tracing(None)
    assert not tracing.enabled
    first = tracing.span("http.request", route="/v1/completions")
    assert first is NOOP_SPAN and tracing.span("stream") is NOOP_SPAN
    with tracing.span("admission", tenant="acme") as span:
        span.set_attribute("queued", True)
        span.add_event("admitted")
    assert tracing.force_flush()
    tracing.shutdown()


def test_disabled_span_does_not_swallow_exceptions():
    with pytest.raises(KeyError):
        with Tracing(None).span("engine.generate"):
            raise KeyError("x")


@pytest.mark.parametrize("endpoint, expected", [
    ("http://collector:4318", "http://collector:4318/v1/traces"),
    ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ("https://otel.example/custom/path", "https://otel.example/custom/path"),
])
def test_traces_url(endpoint, expected):
    assert traces_url(endpoint) == expected


@pytest.fixture
def memory():
    exporter = InMemorySpanExporter()
    tracing = Tracing(None, service_name="loraplex-test", exporter=exporter)
    yield tracing, exporter
    tracing.shutdown()


def test_spans_nest_and_carry_attributes(memory):
    tracing, exporter = memory
    with tracing.span("http.request", route="/v1/chat/completions", tenant="acme", absent=None):
        with tracing.span("admission", priority="high"):
            pass
        with tracing.span("engine.generate", model="support@3") as span:
            span.set_attribute("completion_tokens", 7)
            with tracing.span("stream"):
                pass
    tracing.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"http.request", "admission", "engine.generate", "stream"}
    root = spans["http.request"]
    assert root.parent is None
    assert dict(root.attributes) == {"route": "/v1/chat/completions", "tenant": "acme"}
    assert spans["admission"].parent.span_id == root.context.span_id
    assert spans["engine.generate"].parent.span_id == root.context.span_id
    assert spans["stream"].parent.span_id == spans["engine.generate"].context.span_id
    assert {s.context.trace_id for s in spans.values()} == {root.context.trace_id}
    assert spans["engine.generate"].attributes["completion_tokens"] == 7
    assert root.resource.attributes["service.name"] == "loraplex-test"


def test_exception_marks_the_span(memory):
    tracing, exporter = memory
    with pytest.raises(ValueError):
        with tracing.span("adapter.load", adapter="support"):
            raise ValueError("bad adapter")
    tracing.force_flush()
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"


def test_incoming_traceparent_becomes_the_parent(memory):
    tracing, exporter = memory
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with tracing.span("http.request", carrier={"traceparent": f"00-{trace_id}-{parent_id}-01"}):
        pass
    tracing.force_flush()
    [span] = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id
    assert format(span.parent.span_id, "016x") == parent_id


def test_private_provider_leaves_the_global_one_alone(memory):
    tracing, exporter = memory
    with tracing.span("http.request"):
        assert not trace.get_tracer("someone-else").start_span("x").is_recording()
    tracing.shutdown()
    assert tracing.span("after-shutdown") is NOOP_SPAN


def test_otlp_http_export_to_a_loopback_collector():
    collector = OtlpCollector()
    try:
        tracing = Tracing(collector.url, service_name="loraplex")
        with tracing.span("http.request", tenant="acme"):
            with tracing.span("engine.generate"):
                pass
        tracing.shutdown()  # flushes the batch
    finally:
        collector.stop()
    assert collector.requests, "no OTLP export arrived"
    path, content_type, _ = collector.requests[0]
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    assert {(service, span.name) for service, span in collector.spans()} == {
        ("loraplex", "http.request"), ("loraplex", "engine.generate")}


def test_a_carrier_hands_the_current_span_to_another_process(memory):
    tracing, exporter = memory
    assert carrier() == {}  # no span: nothing to join
    other = Tracing(None, service_name="loraplex-replica", exporter=exporter)
    with tracing.span("engine.generate") as caller:
        headers = carrier()
        with other.span("replica.generate", carrier=headers):
            pass
    other.force_flush()
    tracing.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["replica.generate"].parent.span_id == caller.get_span_context().span_id
    assert spans["replica.generate"].context.trace_id == spans["engine.generate"].context.trace_id
    assert spans["replica.generate"].resource.attributes["service.name"] == "loraplex-replica"
    other.shutdown()


async def test_a_traced_stream_iterated_after_its_span_ended_stays_in_its_trace(memory):
    """A streamed response is iterated by the server after the route returned and its `http.request` span closed."""
    tracing, exporter = memory

    async def items():
        with tracing.span("engine.generate"):
            yield 1
            yield 2

    with tracing.span("http.request"):
        stream = traced(items(), tracing, "stream")
    assert [item async for item in stream] == [1, 2]
    tracing.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["http.request"]
    assert spans["stream"].parent.span_id == root.context.span_id
    assert spans["engine.generate"].parent.span_id == spans["stream"].context.span_id
    assert {s.context.trace_id for s in spans.values()} == {root.context.trace_id}
