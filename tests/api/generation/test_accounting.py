"""The account of one request: closed once, whatever escapes, with the status that matches what escaped."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry, Gauge

from api.auth import Caller
from api.errors import OpenAIError
from api.generation.accounting import Accounts, OutcomeSink, RequestAccount, closes_on_failure, failure_status
from api.lifecycle import Lifecycle
from api.tenancy.config import TenancyConfig
from api.tenancy.pricing import ComputeMeter, PriceTable


@pytest.mark.parametrize(("error", "status"), [
    (OpenAIError(404, "nope"), 404),
    (OpenAIError(429, "slow down"), 429),
    (asyncio.CancelledError(), 499),
    (RuntimeError("a bug"), 500),
    (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), 500),
    (KeyboardInterrupt(), 500),
])
def test_failure_status(error, status):
    assert failure_status(error) == status


def account() -> tuple[RequestAccount, list]:
    recorded = []
    acc = RequestAccount(OutcomeSink([lambda outcome, finish: recorded.append((outcome.status, finish))]), "r1")
    acc.cleanups.append(lambda a: recorded.append("cleanup"))
    acc.after_record.append(lambda: recorded.append("after record"))
    return acc, recorded


@pytest.mark.parametrize(("error", "status", "finish"), [
    (OpenAIError(400, "bad"), 400, "error"),
    (asyncio.CancelledError(), 499, "aborted"),
    (TypeError("unexpected"), 500, "error"),
])
async def test_anything_that_escapes_closes_the_account_once(error, status, finish):
    acc, recorded = account()
    with pytest.raises(type(error)):
        async with closes_on_failure(acc):
            raise error
    assert recorded == ["cleanup", (status, finish), "after record"]
    assert await acc.close(200) is None  # already closed: nothing runs twice
    assert recorded == ["cleanup", (status, finish), "after record"]


async def test_a_block_that_ends_normally_leaves_the_account_open():
    acc, recorded = account()
    async with closes_on_failure(acc):
        pass
    assert recorded == [] and not acc.closed
    await acc.close(200)
    assert recorded == ["cleanup", (200, "completed"), "after record"]


async def test_the_record_is_written_off_the_event_loop():
    loop_thread = threading.get_ident()
    threads = []
    acc = RequestAccount(OutcomeSink([lambda outcome, finish: threads.append(threading.get_ident())]), "r1")
    await acc.close(200)
    assert threads and threads[0] != loop_thread


async def test_outcomes_that_finish_while_the_writer_writes_are_written_together():
    started, release, batches = threading.Event(), threading.Event(), []

    def ledger(rows):
        batches.append([outcome.request_id for outcome, _ in rows])
        started.set()
        release.wait(30)  # the first batch holds the writer until the others are queued

    sink = OutcomeSink([], batch_readers=[ledger])
    first = asyncio.ensure_future(RequestAccount(sink, "r1").close(200))
    await asyncio.to_thread(started.wait, 30)
    others = [sink.submit(RequestAccount(sink, request_id).finish(200)) for request_id in ("r2", "r3")]
    release.set()
    await asyncio.gather(first, *others)
    assert batches == [["r1"], ["r2", "r3"]]


@pytest.mark.parametrize(("billing_key", "status", "request_id", "billing"), [
    ("batch_1:4", 200, "batch_1:4", "once"),  # the attempt that produced the line's result: billed once, its key
    ("batch_1:4", 499, "attempt-2", "none"),  # preempted: it runs again, no ledger row
    ("batch_1:4", 429, "attempt-2", "none"),
    (None, 200, "attempt-2", "row"),  # a live request
    (None, 499, "attempt-2", "row"),
])
def test_queued_work_is_billed_only_for_its_successful_attempt(billing_key, status, request_id, billing):
    acc = RequestAccount(OutcomeSink([]), "attempt-2", billing_key=billing_key, price_of=lambda p, c: 5.0)
    outcome = acc.finish(status)
    assert (outcome.request_id, outcome.billing, outcome.price_usd) == (request_id, billing, 5.0)


async def test_a_request_counts_in_flight_until_its_outcome_is_recorded():
    registry = CollectorRegistry()
    in_flight = Gauge("in_flight", "", registry=registry)
    recording, go_on = threading.Event(), threading.Event()

    def slow_record(outcome, finish) -> None:
        recording.set()
        go_on.wait(10)

    tenancy = TenancyConfig.open_default()
    accounts = Accounts(OutcomeSink([slow_record]), tenancy, PriceTable(tenancy), ComputeMeter(0.0), in_flight,
                        Lifecycle())
    acc = accounts.open("r1", Caller("default"))
    closing = asyncio.create_task(acc.close(499))
    await asyncio.to_thread(recording.wait, 10)
    assert registry.get_sample_value("in_flight") == 1  # the outcome is not in the metrics and the ledger yet
    go_on.set()
    await closing
    assert registry.get_sample_value("in_flight") == 0
