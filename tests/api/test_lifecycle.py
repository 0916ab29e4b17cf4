"""SIGTERM drain over real HTTP (uvicorn on loopback) around the fake engine, whose generation can be held
open, so the checks during the drain do not race the end of the running request."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from openai._constants import DEFAULT_CONNECTION_LIMITS

from api.config import ServerConfig
from api.input_limits import InputLimits
from api.lifecycle import Lifecycle, http_config
from api.tenancy.ledger import UsageLedger
from tests.api.running_server import RunningServer


def _stream(url: str, events: list[str]) -> None:
    try:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=10,
                          json={"model": "fake-base", "prompt": "x", "max_tokens": 4, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
    except httpx.HTTPError:
        events.append("cut")


@pytest.fixture
def held(fake_engine):
    fake_engine.tokens_per_request = 4
    fake_engine.hold = threading.Event()
    return fake_engine.hold


def _start_held_stream(url: str) -> tuple[threading.Thread, list[str]]:
    events: list[str] = []
    thread = threading.Thread(target=_stream, args=(url, events))
    thread.start()
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events, "the stream started"
    return thread, events


def test_drain_refuses_new_work_finishes_running_then_stops(fake_app, fake_server, held):
    with RunningServer(fake_app, fake_server.lifecycle, drain_timeout_s=30) as running, \
            httpx.Client(base_url=running.url, timeout=10) as client:
        assert client.get("/ready").status_code == 200
        thread, events = _start_held_stream(running.url)
        running.sigterm()
        deadline = time.monotonic() + 10
        while client.get("/ready").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.01)
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
        refused = client.post("/v1/completions", json={"model": "fake-base", "prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert client.get("/health").status_code == 200, "still serving while it drains"
        assert running.thread.is_alive() and fake_server.lifecycle.in_flight == 1
        held.set()
        thread.join(10)
        assert len(events) == 5 and events[-1] == "data: [DONE]", "the running stream finished"
        running.thread.join(10)
        assert not running.thread.is_alive(), "stopped once the drain completed"
        # uvicorn re-raises captured signals after shutdown; a completed drain must exit 0 instead.
        assert running.server._captured_signals == []


def test_drain_timeout_bounds_the_wait(fake_app, fake_server, held):
    with RunningServer(fake_app, fake_server.lifecycle, drain_timeout_s=0.5) as running:
        thread, events = _start_held_stream(running.url)
        started = time.monotonic()
        running.sigterm()
        running.thread.join(10)
        assert not running.thread.is_alive()
        # 0.5 s of drain, then uvicorn's graceful shutdown (1 s here) cancels what is left.
        assert time.monotonic() - started < 5
        thread.join(10)
        assert events[-1] == "cut", "the held stream was cut, not completed"
    # The cancelled request still records its usage: the lifespan waits for it before closing the ledger.
    with UsageLedger.reader(fake_server.ledger.path) as ledger:
        rows = ledger.query()
    assert [(r["status"], r["completion_tokens"]) for r in rows] == [(499, 1)]


def test_the_default_keep_alive_outlasts_the_openai_clients_idle_connections():
    """A server that closes an idle connection first races the client's next request on it: the request is lost
    without an answer. The openai SDK (httpx) drops its own idle connections after 5 s."""
    assert ServerConfig().keep_alive_s > DEFAULT_CONNECTION_LIMITS.keepalive_expiry
    assert http_config(None, InputLimits(), keep_alive_s=42).timeout_keep_alive == 42


async def _ok(scope, receive, send):
    """The smallest HTTP app: keep-alive is uvicorn's, whatever the app."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def _get(sock: socket.socket) -> bytes:
    """One request on an open connection; the reply's status line."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection instead of answering")
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return lines[0]


def test_an_idle_connection_is_closed_after_keep_alive_s_and_kept_longer_by_default():
    with RunningServer(_ok, Lifecycle(), keep_alive_s=0.5) as short, RunningServer(_ok, Lifecycle()) as default, \
            socket.create_connection(short.sock.getsockname(), timeout=30) as to_short, \
            socket.create_connection(default.sock.getsockname(), timeout=30) as to_default:
        asked = time.monotonic()  # both idle timers start after this, when the answers are sent
        assert _get(to_default) == b"HTTP/1.1 200 OK"  # idle from before the short server's answer
        assert _get(to_short) == b"HTTP/1.1 200 OK"
        assert to_short.recv(1) == b"", "the short setting closed its idle connection"
        assert time.monotonic() - asked >= 0.5, "and not before its time"
        assert _get(to_default) == b"HTTP/1.1 200 OK", "idle longer than that, the default's is still served"
