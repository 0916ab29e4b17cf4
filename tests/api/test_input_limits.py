"""Hostile inputs get a clear 4xx and the server keeps serving: body size, JSON depth and constants, invalid
Unicode, prompt counts, stop strings, sequences, numeric ranges, oversized headers and URLs."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from api.body import json_depth
from api.errors import OpenAIError
from api.input_limits import InputLimits, check_request_size
from tests.api.running_server import RunningServer

CHAT = {"model": "fake-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": "fake-base", "prompt": "hi", "max_tokens": 4}


@pytest.mark.parametrize(("raw", "depth"), [
    (b"{}", 1),
    (b'{"a": [1, {"b": []}]}', 4),
    (b'{"a": "[[[[[[{{{{"}', 1),  # brackets inside strings do not count
    (b'{"a": "\\"[[[["}', 1),  # nor after an escaped quote
    (b"[" * 50 + b"]" * 50, 50),
])
def test_json_depth(raw, depth):
    assert json_depth(raw) == depth


LIMITS = InputLimits()


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"prompts": 65, "n": 1, "stop": None}, "prompt"),
    ({"prompts": 1, "n": 1, "stop": None, "messages": 1025}, "messages"),
    ({"prompts": 1, "n": 1, "stop": "x" * 257}, "stop"),
    ({"prompts": 1, "n": 1, "stop": ["ok", "x" * 257]}, "stop[1]"),
    ({"prompts": 8, "n": 9, "stop": None}, "n"),
    ({"prompts": 65, "n": 16, "stop": "x" * 300}, "prompt"),  # every problem listed, the first named
])
def test_check_request_size_refuses(kwargs, param):
    with pytest.raises(OpenAIError) as info:
        check_request_size(LIMITS, **kwargs)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, "request_too_large")


def test_check_request_size_lists_every_problem():
    with pytest.raises(OpenAIError) as info:
        check_request_size(LIMITS, prompts=65, n=16, stop="x" * 300)
    assert "65 prompts" in info.value.message and "stop string" in info.value.message
    assert "sequences" in info.value.message


@pytest.mark.parametrize("kwargs", [
    {"prompts": 64, "n": 1, "stop": None},
    {"prompts": 4, "n": 16, "stop": ["x" * 256] * 4, "messages": 1024},
])
def test_check_request_size_accepts_what_fits(kwargs):
    check_request_size(LIMITS, **kwargs)


async def _still_serving(client) -> None:
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize(("body", "status", "code"), [
    (b'{"model": "fake-base", "prompt": "' + b"x" * (9 * 2**20) + b'"}', 413, "request_too_large"),
    (b'{"model": "fake-base", "prompt": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}", 400, "invalid_json"),
    (b'{"model": "fake-base", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "invalid_json"),
    (b'{"model": "fake-base", "prompt": "hi", "temperature": NaN}', 400, "invalid_json"),
    (b'{"model": "fake-base", "prompt": "hi", "top_p": Infinity}', 400, "invalid_json"),
    (b'{"model": "fake-base", "prompt": "\\ud800"}', 400, "invalid_text"),
    (b'{"model": "fake-base", "prompt": "ok \\udfff ok"}', 400, "invalid_text"),
])
async def test_hostile_completion_bodies(fake_client, body, status, code):
    response = await fake_client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    await _still_serving(fake_client)


async def test_lone_surrogate_in_chat_content_is_400(fake_client):
    body = b'{"model": "fake-base", "messages": [{"role": "user", "content": "\\ud800"}]}'
    response = await fake_client.post("/v1/chat/completions", content=body,
                                      headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_text"


async def test_a_valid_surrogate_pair_is_fine(fake_client):
    body = b'{"model": "fake-base", "prompt": "\\ud83d\\ude00", "max_tokens": 2}'
    response = await fake_client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200


async def test_a_chunked_body_over_the_limit_is_413(fake_client):
    async def chunks():
        for _ in range(10):
            yield b"x" * 2**20

    response = await fake_client.post("/v1/completions", content=chunks(),
                                      headers={"content-type": "application/json"})
    assert response.status_code == 413


@pytest.mark.parametrize(("fields", "param"), [
    ({"prompt": ["a"] * 65}, "prompt"),
    ({"prompt": "a", "n": 16, "stop": "x" * 300}, "stop"),
    ({"prompt": ["a"] * 8, "n": 9}, "n"),
    ({"prompt": "a", "max_tokens": 2**31}, "max_tokens"),
    ({"prompt": "a", "top_k": 2**40}, "top_k"),
    ({"prompt": "a", "min_tokens": 2**63}, "min_tokens"),
    ({"prompt": [[1, 2, -5]]}, "prompt"),
])
async def test_oversized_and_out_of_range_fields(fake_client, fields, param):
    response = await fake_client.post("/v1/completions", json={"model": "fake-base", **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    await _still_serving(fake_client)


def _raw_request(url: str, request: bytes, timeout: float = 10.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused and closed before the client finished sending: what these tests want
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("request_bytes", [
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * 2**20) + b"\r\n\r\n",
    b"GET /health?" + b"q" * (2 * 2**20) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
], ids=["2 MB header", "2 MB URL"])
def test_oversized_headers_and_urls_are_refused_quickly(fake_app, fake_server, request_bytes):
    with RunningServer(fake_app, fake_server.lifecycle) as running:
        started = time.monotonic()
        answer = _raw_request(running.url, request_bytes)
        # Half the client's timeout: the server answered or closed; it did not wait the client out.
        assert time.monotonic() - started < 5.0
        assert answer == b"" or answer.split(b" ", 2)[1] == b"431", answer[:200]
        assert httpx.get(f"{running.url}/health", timeout=5).status_code == 200


def test_a_large_body_after_a_small_head_is_not_a_large_head(fake_app, fake_server):
    """The head's bound must not count the body that arrives in the same read."""
    body = b'{"model": "fake-base", "prompt": "' + b"x" * 200_000 + b'", "max_tokens": 2}'
    with RunningServer(fake_app, fake_server.lifecycle) as running:
        response = httpx.post(f"{running.url}/v1/completions", content=body, timeout=30,
                              headers={"content-type": "application/json"})
        # Read whole and judged by the app (the fake model's context is 64 tokens), not refused as a head.
        assert response.json()["error"]["code"] == "context_length_exceeded", response.text
