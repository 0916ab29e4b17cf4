"""Async jobs over the real HTTP server on the fake engine: a job id at once, the result when done, webhooks
only to allowed prefixes, results dropped after their keeping time."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from api.app import create_app
from api.batch.config import BatchConfig
from tests.api.running_server import RunningServer

BODY = {"model": "fake-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class Receiver:
    """A loopback HTTP endpoint that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.received = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                receiver.events.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(204)
                self.end_headers()
                receiver.received.set()

            def log_message(self, *args):
                pass

        self.http = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}/hook"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.http.shutdown()


@pytest.fixture
def served(make_fake_server, tmp_path, receiver):
    config = BatchConfig(batch_store_path=str(tmp_path / "batches.sqlite"), files_store_uri=str(tmp_path / "files"),
                         async_result_ttl_s=1.0, async_webhook_prefixes=f"{receiver.url},http://example.invalid/")
    server = make_fake_server(batch=config)
    with RunningServer(create_app(server), server.lifecycle) as running:
        yield server, running.url


def poll(url: str, job_id: str) -> dict:
    deadline = time.monotonic() + 30
    while (job := httpx.get(f"{url}/v1/async/{job_id}").json())["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return job


def test_a_job_answers_at_once_and_its_result_is_polled_then_dropped(served, receiver):
    _, url = served
    submitted = httpx.post(f"{url}/v1/async/chat/completions", json={**BODY, "webhook_url": receiver.url})
    assert submitted.status_code == 202 and submitted.json()["status"] in ("queued", "in_progress")
    job = poll(url, submitted.json()["id"])
    assert job["status"] == "completed" and job["status_code"] == 200
    assert job["response"]["object"] == "chat.completion" and job["response"]["usage"]["completion_tokens"] == 3
    assert receiver.received.wait(10) and receiver.events == [
        {"id": job["id"], "object": "async.job.event", "status": "completed"}]
    time.sleep(max(0.0, job["expires_at"] - time.time()) + 0.05)  # the keeping time is the thing under test
    gone = httpx.get(f"{url}/v1/async/{job['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "job_not_found"


@pytest.mark.parametrize(("body", "status", "code"), [
    ({**BODY, "webhook_url": "http://127.0.0.1:1/elsewhere"}, 400, "webhook_not_allowed"),
    ({**BODY, "model": "no-such-model"}, 404, "model_not_found"),
    ({**BODY, "stream": True}, 400, "invalid_value"),
    ({"model": "fake-base"}, 400, "invalid_value"),
])
def test_a_job_the_live_endpoint_would_refuse_is_refused_at_once(served, body, status, code):
    _, url = served
    refused = httpx.post(f"{url}/v1/async/chat/completions", json=body)
    assert refused.status_code == status and refused.json()["error"]["code"] == code


def test_a_job_that_fails_in_the_engine_reports_its_error(served, fake_engine):
    _, url = served
    fake_engine.fail_after = 1
    job = poll(url, httpx.post(f"{url}/v1/async/completions",
                               json={"model": "fake-base", "prompt": "hi", "max_tokens": 3}).json()["id"])
    assert job["status"] == "failed" and job["status_code"] == 500 and job["error"]["code"] == "engine_error"
