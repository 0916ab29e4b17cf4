"""Whatever is raised anywhere on a request's path, everything it took is given back exactly once and one ledger
row is written; the server keeps serving. Fake engine, real server parts (limits, admission, ledger, metrics)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from api.app import create_app
from api.tenancy.ledger import LedgerError

CHAT = {"model": "fake-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Injected(Exception):
    """Stands for any exception nobody planned for: a botocore ClientError, a tokenizer TypeError, ..."""


def fail_with(error: BaseException):
    def raising(*args, **kwargs):
        raise error

    async def raising_async(*args, **kwargs):
        raise error

    return raising, raising_async


def _inject(server, fake_engine, monkeypatch, point: str, error: BaseException) -> None:
    sync, async_ = fail_with(error)
    p = server.pipeline
    if point == "resolve":
        monkeypatch.setattr(p.resolver, "resolve", sync)
    elif point == "tokenize":
        monkeypatch.setattr(fake_engine._tokenizer, "apply_chat_template", sync)
    elif point == "limits":
        admit = p.limits.admit

        async def admit_then_fail(*args, **kwargs):  # after the reservation was taken
            await admit(*args, **kwargs)
            sync()

        monkeypatch.setattr(p.limits, "admit", admit_then_fail)
    elif point == "admission":
        monkeypatch.setattr(p.admission.queue, "acquire", async_)
    elif point == "adapter":
        monkeypatch.setattr(p.loading.loader, "enter", async_)
    elif point == "engine-start":
        fake_engine.fail_after, fake_engine.fail_with = 0, error
    elif point == "engine-mid-stream":
        fake_engine.fail_after, fake_engine.fail_with = 2, error
    elif point == "respond":
        monkeypatch.setattr(server.chat, "stream_events", fail_stream(error))
        monkeypatch.setattr(server.chat, "collect", async_)
    else:
        raise ValueError(point)


def fail_stream(error: BaseException):
    async def events(*args, **kwargs):
        yield "data: {}\n\n"
        raise error

    return events


POINTS = ["resolve", "tokenize", "limits", "admission", "adapter", "engine-start", "engine-mid-stream", "respond"]


def taken(server) -> dict[str, float]:
    """Everything a request holds while it runs."""
    p = server.pipeline
    return {
        "in_flight_gauge": server.metrics.registry.get_sample_value("loraplex_requests_in_flight"),
        "draining_count": server.lifecycle.in_flight,
        "admission_slots": p.admission.queue.running,
        "admission_queued": len(p.admission.queue._queue),
        "tenant_slots": sum(p.limits.backend.running(t.name) for t in server.config.tenancy.tenants),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("error", [Injected("boom"), TypeError("bad type"), asyncio.CancelledError()],
                         ids=["exception", "type-error", "cancelled"])
async def test_everything_is_given_back(make_fake_server, fake_engine, monkeypatch, point, stream, error):
    server = make_fake_server()
    app = create_app(server)
    before = taken(server)
    _inject(server, fake_engine, monkeypatch, point, error)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake") as client:
        try:
            response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        except (asyncio.CancelledError, Injected, TypeError):
            response = None  # raised through the in-process transport, as a dropped connection would be
        except AssertionError:
            # httpx's in-process transport asserts when a response never completes: a cancelled stream
            assert isinstance(error, asyncio.CancelledError) and stream
            response = None
        if response is not None and not stream:
            assert response.status_code >= 400
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        if response is not None and stream and response.status_code == 200:
            assert "error" in json.loads([x for x in response.text.split("\n\n") if x][-2][len("data: "):])
        assert taken(server) == before, f"leaked at {point}"
        rows = server.ledger.query()
        assert len(rows) == 1 and rows[0]["status"] >= 400, rows
        monkeypatch.undo()
        fake_engine.fail_after = None
        ok = await client.post("/v1/chat/completions", json=CHAT)
        assert ok.status_code == 200, ok.text
    assert taken(server) == before
    assert len(server.ledger.query()) == 2


async def test_a_stream_that_never_starts_still_closes_its_account(fake_app, fake_server):
    """The connection breaks as the response starts: the SSE generator never runs, so only the response
    object can close the account."""
    body = json.dumps({**CHAT, "stream": True}).encode()
    incoming = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # the client says nothing more

    async def send(message):
        if message["type"] == "http.response.start":
            raise OSError("connection reset by peer")

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 9), "server": ("127.0.0.1", 80)}
    before = taken(fake_server)
    with pytest.raises(OSError):
        await fake_app(scope, receive, send)
    assert taken(fake_server) == before
    rows = fake_server.ledger.query()
    assert len(rows) == 1 and rows[0]["status"] == 499 and rows[0]["completion_tokens"] == 0


async def test_a_tenant_whose_usage_cannot_be_recorded_is_refused_until_it_can(make_fake_server, monkeypatch):
    server = make_fake_server()
    writer = server.pipeline.billing
    monkeypatch.setattr(writer, "_delays", ())
    real = server.ledger.record_many
    monkeypatch.setattr(server.ledger, "record_many", lambda rows, on_conflict: (_ for _ in ()).throw(
        LedgerError("disk full")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)), base_url="http://f") as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200  # served, its row pending
        refused = await c.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "billing_unavailable"
        assert refused.headers["retry-after"] == "5"
        monkeypatch.setattr(server.ledger, "record_many", real)
        assert writer.retry_pending() == 1
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert len(server.ledger.query()) == 2  # the refused request never ran, so it has no row
