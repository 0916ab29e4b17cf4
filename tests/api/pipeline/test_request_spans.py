"""Spans of one request through the HTTP layer (fake engine): request, admission, engine, stream."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.app import create_app
from engine.tracing import Tracing

CHAT = {"model": "fake-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_spans_cover_request_admission_engine_and_stream(make_fake_server):
    exporter = InMemorySpanExporter()
    tracing = Tracing(None, exporter=exporter)
    transport = httpx.ASGITransport(app=create_app(make_fake_server(tracing=tracing)))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.post("/v1/chat/completions", json={**CHAT, "stream": True})).status_code == 200
    tracing.force_flush()
    names = [span.name for span in exporter.get_finished_spans()]
    assert names.count("http.request") == 2
    assert names.count("admission") == 2
    assert names.count("engine.generate") == 2
    assert names.count("stream") == 1
    engine = [s for s in exporter.get_finished_spans() if s.name == "engine.generate"][0]
    assert engine.attributes["model"] == "fake-base" and engine.attributes["items"] == 4
    tracing.shutdown()
