"""Tenant limits over real HTTP (uvicorn on loopback) around the fake engine, whose generation is held open so
that the slot stays taken for as long as the test needs (a real engine may finish a long stream into socket
buffers before a second request arrives)."""

from __future__ import annotations

import threading

import httpx

from api.app import create_app
from api.tenancy.config import parse_tenancy_config
from api.tenancy.keys import hash_key
from api.tenancy.limits_backend import LimitsUnavailable
from tests.api.running_server import RunningServer

KEY = "lpx-solo"
BODY = {"model": "fake-base", "prompt": "x", "max_tokens": 4}


def test_max_concurrent_refuses_while_a_stream_holds_the_slot(make_fake_server, fake_engine):
    tenancy = parse_tenancy_config({"tenants": [
        {"name": "solo", "key_hashes": [hash_key(KEY)], "adapters": ["*"], "limits": {"max_concurrent": 1}}]})
    server = make_fake_server(tenancy=tenancy)
    fake_engine.hold = threading.Event()
    headers = {"Authorization": f"Bearer {KEY}"}
    with RunningServer(create_app(server), server.lifecycle) as running:
        started = threading.Event()

        def stream() -> None:
            with httpx.stream("POST", f"{running.url}/v1/completions", headers=headers, timeout=30,
                              json={**BODY, "stream": True}) as response:
                for _ in response.iter_lines():
                    started.set()

        thread = threading.Thread(target=stream)
        thread.start()
        try:
            assert started.wait(10)
            refused = httpx.post(f"{running.url}/v1/completions", headers=headers, json=BODY, timeout=30)
        finally:
            fake_engine.hold.set()
            thread.join(10)
        assert refused.status_code == 429 and "max_concurrent" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"]
        assert httpx.post(f"{running.url}/v1/completions", headers=headers, json=BODY, timeout=30).status_code == 200


async def test_an_unreachable_limits_store_refuses_with_503(fake_server, fake_client, monkeypatch):
    def unreachable(*args, **kwargs):
        raise LimitsUnavailable("the limits store is unreachable: connection refused")

    monkeypatch.setattr(fake_server.pipeline.limits.backend, "admit", unreachable)
    refused = await fake_client.post("/v1/completions", json=BODY)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["code"] == "limits_unavailable"
    monkeypatch.undo()
    assert (await fake_client.post("/v1/completions", json=BODY)).status_code == 200
