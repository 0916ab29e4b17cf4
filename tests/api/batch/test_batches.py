"""Files and Batches over the real HTTP server and the real `openai` SDK, on the fake engine (fast): lifecycle,
per-line validation, cancel, expiry, tenant isolation, billing once per line at the batch discount."""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import closing

import pytest
from openai import NotFoundError, OpenAI

from api.app import create_app
from api.batch.store import BatchStore
from api.tenancy.config import parse_tenancy_config
from api.tenancy.keys import generate_key, hash_key
from api.tenancy.ledger import UsageLedger
from tests.api.running_server import RunningServer

MODEL = "fake-base"
KEYS = {"acme": generate_key(), "globex": generate_key()}


def chat_line(custom_id: str, model: str = MODEL, url: str = "/v1/chat/completions", **extra) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": f"hello {custom_id}"}], "max_tokens": 3,
            **extra}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(*lines: str) -> io.BytesIO:
    return io.BytesIO(("\n".join(lines) + "\n").encode())


@pytest.fixture
def served(make_fake_server, fake_engine):
    tenancy = parse_tenancy_config({
        "pricing": {"default": {"prompt": 1.0, "completion": 2.0}, "batch_discount": 0.5},
        "tenants": [{"name": name, "key_hashes": [hash_key(key)], "adapters": ["*"],
                     "limits": {"max_batch_queued_tokens": 2000} if name == "globex" else {}}
                    for name, key in KEYS.items()],
        # The base model twice: the first stage's answer (any text) always escalates to the second.
        "virtual_models": {"twice": {"cascade": {"stages": [MODEL, MODEL], "escalate_when": {"output_matches": "."}}}},
    })
    server = make_fake_server(tenancy=tenancy)
    with RunningServer(create_app(server), server.lifecycle) as running:
        yield server, running.url


def client(url: str, tenant: str = "acme") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=30)


def wait_final(c: OpenAI, batch_id: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = c.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def wait_status(c: OpenAI, batch_id: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while c.batches.retrieve(batch_id).status != status:
        assert time.monotonic() < deadline, f"batch {batch_id} never reached {status}"
        time.sleep(0.02)


def test_a_batch_cancelled_at_once_ends_cancelled(served):
    _, url = served
    c = client(url)
    batch = c.batches.create(input_file_id=c.files.create(
        file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(2000)))), purpose="batch").id,
        endpoint="/v1/chat/completions", completion_window="24h")
    assert c.batches.cancel(batch.id).status == "cancelling"
    cancelled = wait_final(c, batch.id)
    # Cancelled while validating (most often: 2000 lines take a while) it ran nothing; else its pending lines closed.
    counts = cancelled.request_counts
    assert cancelled.status == "cancelled" and counts.completed < 2000 and counts.total in (0, 2000)


def test_a_batch_runs_every_line_and_bills_each_once_at_the_discount(served):
    server, url = served
    c = client(url)
    uploaded = c.files.create(file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(5)))), purpose="batch")
    assert (uploaded.purpose, uploaded.filename) == ("batch", "in.jsonl")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                             metadata={"job": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    done = wait_final(c, batch.id)
    assert done.status == "completed" and done.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.error_file_id is None
    lines = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in lines) == [f"r{i}" for i in range(5)]
    assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["object"] == "chat.completion"
               for x in lines)
    rows = [r for r in server.ledger.query() if r["priority"] == "batch"]
    assert sorted(r["request_id"] for r in rows) == sorted(f"{batch.id}:{n}" for n in range(1, 6))
    for r in rows:
        assert r["price_usd"] == pytest.approx((r["prompt_tokens"] + 2 * r["completion_tokens"]) / 1e6 * 0.5)


def test_a_line_may_name_a_virtual_model_whose_runs_are_each_billed_once(served):
    server, url = served
    c = client(url)
    content = jsonl(chat_line("graph", model="twice"), chat_line("plain"))
    batch = c.batches.create(input_file_id=c.files.create(file=("in.jsonl", content), purpose="batch").id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_final(c, batch.id)
    assert done.status == "completed", done.errors
    lines = {x["custom_id"]: x for x in map(json.loads, c.files.content(done.output_file_id).text.splitlines())}
    graph = lines["graph"]["response"]["body"]
    assert graph["loraplex"]["virtual_model"] == "twice" and len(graph["loraplex"]["runs"]) == 2
    assert graph["usage"]["completion_tokens"] == sum(r["usage"]["completion_tokens"]
                                                      for r in graph["loraplex"]["runs"])
    assert "loraplex" not in lines["plain"]["response"]["body"]
    rows = [r for r in server.ledger.query() if r["priority"] == "batch"]
    assert sorted(r["request_id"] for r in rows) == [f"{batch.id}:1.twice.0", f"{batch.id}:1.twice.1",
                                                     f"{batch.id}:2"]


def test_a_virtual_model_line_is_checked_like_a_live_request(served):
    _, url = served
    c = client(url)
    content = jsonl(chat_line("a", model="twice", n=2), chat_line("b", model="twice", max_tokens=10**9))
    batch = c.batches.create(input_file_id=c.files.create(file=("in.jsonl", content), purpose="batch").id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    failed = wait_final(c, batch.id)
    assert failed.status == "failed"
    assert [(e.line, e.code, e.param) for e in failed.errors.data] == [
        (1, "unsupported_parameter", "n"), (2, "context_length_exceeded", "max_tokens")]


def test_bad_lines_are_reported_with_their_line_numbers(served):
    _, url = served
    c = client(url)
    content = jsonl(chat_line("a"), "{not json", chat_line("a"), chat_line("b", url="/v1/completions"),
                    chat_line("c", model="no-such-adapter"), chat_line("d", n=99))
    batch = c.batches.create(input_file_id=c.files.create(file=("bad.jsonl", content), purpose="batch").id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    failed = wait_final(c, batch.id)
    assert failed.status == "failed" and failed.failed_at
    assert [(e.line, e.code) for e in failed.errors.data] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_endpoint"), (5, "model_not_found"),
        (6, "invalid_value")]


def test_no_line_is_taken_while_admission_would_not_start_it(served):
    server, url = served
    runner = server.batches.runner
    asked = threading.Semaphore(0)

    def closed() -> bool:  # as admission answers while live requests run, or in its quiet period after them
        asked.release()
        return False

    runner._may_start = closed
    c = client(url)
    batch = c.batches.create(input_file_id=c.files.create(file=("in.jsonl", jsonl(chat_line("a"), chat_line("b"))),
                                                          purpose="batch").id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    wait_status(c, batch.id, "in_progress")
    while asked.acquire(blocking=False):  # ticks from before the lines were in the store
        pass
    for _ in range(2):  # two ticks of the runner with lines pending, each asking
        assert asked.acquire(timeout=30)
    assert runner.running_lines == 0 and c.batches.retrieve(batch.id).request_counts.completed == 0
    runner._may_start = lambda: True
    runner.wake()
    assert wait_final(c, batch.id).request_counts.completed == 2


def test_cancel_closes_the_lines_not_run(served, fake_engine):
    _, url = served
    c = client(url)
    fake_engine.hold = threading.Event()  # every line waits after its first token: none finishes before the cancel
    batch = c.batches.create(input_file_id=c.files.create(
        file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(200)))), purpose="batch").id,
        endpoint="/v1/chat/completions", completion_window="24h")
    wait_status(c, batch.id, "in_progress")
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    fake_engine.hold.set()
    cancelled = wait_final(c, batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at
    errors = [json.loads(x) for x in c.files.content(cancelled.error_file_id).text.splitlines()]
    assert errors and all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert cancelled.request_counts.completed + len(errors) == 200
    with pytest.raises(Exception) as refused:
        c.batches.cancel(wait_final(c, c.batches.create(
            input_file_id=c.files.create(file=("one.jsonl", jsonl(chat_line("x"))), purpose="batch").id,
            endpoint="/v1/chat/completions", completion_window="24h").id).id)
    assert refused.value.status_code == 409


def test_a_batch_past_its_window_expires_with_what_it_finished(served, fake_engine):
    server, url = served
    c = client(url)
    fake_engine.hold = threading.Event()  # no line finishes until the window has passed
    batch = c.batches.create(input_file_id=c.files.create(
        file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(300)))), purpose="batch").id,
        endpoint="/v1/chat/completions", completion_window="1s")
    deadline = time.monotonic() + 60
    while server.batches.runner.store.counts(batch.id)["expired"] == 0:  # the window closed the lines not started
        assert time.monotonic() < deadline, "the window never closed"
        time.sleep(0.1)
    fake_engine.hold.set()  # the lines in flight finish
    expired = wait_final(c, batch.id)
    assert expired.status == "expired" and expired.expired_at
    errors = [json.loads(x) for x in c.files.content(expired.error_file_id).text.splitlines()]
    assert errors and {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert expired.request_counts.completed + len(errors) == 300


def test_a_tenant_sees_only_its_own_files_and_batches(served):
    _, url = served
    acme, globex = client(url, "acme"), client(url, "globex")
    uploaded = acme.files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch")
    batch = acme.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: globex.files.retrieve(uploaded.id), lambda: globex.files.content(uploaded.id),
                 lambda: globex.files.delete(uploaded.id), lambda: globex.batches.retrieve(batch.id),
                 lambda: globex.batches.cancel(batch.id),
                 lambda: globex.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(NotFoundError):
            call()
    assert [b.id for b in globex.batches.list().data] == []
    assert [b.id for b in acme.batches.list().data] == [batch.id]
    assert acme.files.delete(uploaded.id).deleted
    with pytest.raises(NotFoundError):
        acme.files.retrieve(uploaded.id)


def test_batches_page_newest_first(served):
    _, url = served
    c = client(url)
    file_id = c.files.create(file=("in.jsonl", jsonl(chat_line("a"))), purpose="batch").id
    ids = [c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h").id
           for _ in range(3)]
    first = c.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    rest = c.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == ids[:1] and not rest.has_more
    assert [b.id for b in c.batches.list(limit=1)] == ids[::-1]  # the SDK pages on through `after`


def test_queued_batch_tokens_are_limited_per_tenant(served):
    _, url = served
    c = client(url, "globex")
    content = jsonl(*(chat_line(f"r{i}") for i in range(200)))  # each line reserves prompt + 3 tokens
    batch = c.batches.create(input_file_id=c.files.create(file=("big.jsonl", content), purpose="batch").id,
                             endpoint="/v1/chat/completions", completion_window="24h")
    failed = wait_final(c, batch.id)
    assert failed.status == "failed" and [e.code for e in failed.errors.data] == ["token_limit_exceeded"]


@pytest.mark.parametrize(("purpose", "content", "status"), [
    ("fine-tune", b'{"a": 1}\n', 400),
    ("batch", b"\n\n", 400),
    ("batch", b"\xff\xfe not utf-8", 400),
])
def test_bad_uploads_are_refused(served, purpose, content, status):
    _, url = served
    with pytest.raises(Exception) as refused:
        client(url).files.create(file=("f.jsonl", io.BytesIO(content)), purpose=purpose)
    assert refused.value.status_code == status


def test_sigterm_stops_running_lines_at_once_and_leaves_them_pending(make_fake_server, fake_engine):
    server = make_fake_server()
    fake_engine.hold = threading.Event()  # every line waits in the engine after its first token
    with RunningServer(create_app(server), server.lifecycle, drain_timeout_s=30) as running:
        c = OpenAI(base_url=f"{running.url}/v1", api_key="none", max_retries=0, timeout=30)
        batch = c.batches.create(input_file_id=c.files.create(
            file=("in.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(40)))), purpose="batch").id,
            endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 10
        while server.batches.runner.running_lines == 0 or fake_engine.requests == []:
            assert time.monotonic() < deadline, "no line started"
            time.sleep(0.01)
        started = time.monotonic()
        running.sigterm()
        running.thread.join(10)
        assert not running.thread.is_alive() and time.monotonic() - started < 5, "held lines did not hold the drain"
    with closing(BatchStore(server.config.batch.store_path())) as store:  # the server closed its own
        counts = store.counts(batch.id)
    assert counts == {"pending": 40, "done": 0, "failed": 0, "cancelled": 0,
                                                     "expired": 0}
    with UsageLedger.reader(server.ledger.path) as ledger:
        assert not [r for r in ledger.query() if r["priority"] == "batch"]  # stopped attempts bill nothing
