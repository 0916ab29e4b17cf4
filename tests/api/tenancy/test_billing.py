"""The ledger writer: retried writes, a tenant refused while its rows wait, rows kept across a restart."""

from __future__ import annotations

import dataclasses

import pytest

from api.observability.outcome import RequestOutcome
from api.tenancy.billing import LedgerWriter
from api.tenancy.ledger import LedgerError, UsageLedger


def outcome(request_id: str, tenant: str = "acme") -> RequestOutcome:
    return RequestOutcome(request_id=request_id, tenant=tenant, priority="standard", model="m", version="",
                          status=200, prompt_tokens=3, completion_tokens=2, queue_seconds=0.0, ttft_seconds=0.1,
                          e2e_seconds=0.2, inter_token_seconds=(0.1,), price_usd=0.01, cost_usd=0.001,
                          finished_at=1000.0)


class FlakyLedger:
    """Fails the next `failures` commits, then writes to the real ledger."""

    def __init__(self, ledger: UsageLedger):
        self.ledger, self.failures, self.calls = ledger, 0, 0

    def __call__(self, rows, on_conflict):
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise LedgerError("disk I/O error")
        return self.real(rows, on_conflict)


@pytest.fixture
def ledger(tmp_path):
    with UsageLedger(tmp_path / "usage.sqlite") as ledger:
        yield ledger


@pytest.fixture
def flaky(ledger, monkeypatch):
    flaky = FlakyLedger(ledger)
    flaky.real = ledger.record_many
    monkeypatch.setattr(ledger, "record_many", flaky)
    return flaky


def test_a_failed_write_is_retried_at_once(ledger, flaky):
    writer = LedgerWriter(ledger, retry_delays_s=(0.0, 0.0))
    flaky.failures = 2
    writer.record(outcome("r1"), "completed")
    assert flaky.calls == 3 and writer.pending == 0 and not writer.is_blocked("acme")
    assert [r["request_id"] for r in ledger.query()] == ["r1"]


def test_a_write_that_keeps_failing_blocks_its_tenant_until_written(ledger, flaky):
    writer = LedgerWriter(ledger, retry_delays_s=(0.0, 0.0))
    flaky.failures = 4
    writer.record(outcome("r1", tenant="acme"), "completed")
    writer.record(outcome("r2", tenant="beta"), "completed")  # the 4th failure is r2's first try
    assert writer.pending == 1 and writer.is_blocked("acme") and not writer.is_blocked("beta")
    assert writer.retry_pending() == 1
    assert writer.pending == 0 and not writer.is_blocked("acme")
    assert sorted(r["request_id"] for r in ledger.query()) == ["r1", "r2"]


def test_a_reused_request_id_gets_its_own_row(ledger):
    writer = LedgerWriter(ledger)
    writer.record(outcome("dup"), "completed")
    writer.record(outcome("dup"), "completed")
    ids = [r["request_id"] for r in ledger.query()]
    assert len(ids) == 2 and ids[0] == "dup" and ids[1].startswith("dup#")


def test_a_once_row_is_written_once_and_a_none_row_never(ledger):
    writer = LedgerWriter(ledger)
    once = dataclasses.replace(outcome("batch_1:7"), billing="once")
    writer.record(once, "completed")
    writer.record(dataclasses.replace(once, prompt_tokens=99), "completed")  # the same line, resumed
    writer.record(dataclasses.replace(outcome("batch_1:8#a1"), billing="none", status=499), "aborted")
    assert [(r["request_id"], r["prompt_tokens"]) for r in ledger.query()] == [("batch_1:7", 3)]


def test_rows_unwritten_at_shutdown_are_written_at_the_next_start(tmp_path, monkeypatch):
    path = tmp_path / "usage.sqlite"
    with UsageLedger(path) as ledger:
        monkeypatch.setattr(ledger, "record_many", lambda rows, on_conflict: (_ for _ in ()).throw(
            LedgerError("read-only")))
        writer = LedgerWriter(ledger, retry_delays_s=())
        writer.record(outcome("lost?"), "completed")
        assert writer.pending == 1
        writer.spill()
        assert writer.spill_path.is_file()
    with UsageLedger(path) as ledger:
        writer = LedgerWriter(ledger)
        assert writer.pending == 0 and not writer.spill_path.exists()
        assert [r["request_id"] for r in ledger.query()] == ["lost?"]


def test_rows_that_finish_together_commit_together_or_stay_pending_together(ledger, flaky):
    writer = LedgerWriter(ledger, retry_delays_s=())
    writer.record(outcome("dup"), "completed")
    together = [(outcome("dup"), "completed"), (outcome("r2", tenant="beta"), "completed"),
                (dataclasses.replace(outcome("batch_1:1"), billing="none"), "aborted")]
    flaky.failures = 1
    writer.record_many(together)  # one commit for the three, and it fails: none is written
    assert flaky.calls == 2 and writer.pending == 2 and writer.is_blocked("acme") and writer.is_blocked("beta")
    assert [r["request_id"] for r in ledger.query()] == ["dup"]
    assert writer.retry_pending() == 2
    assert flaky.calls == 4 and writer.pending == 0 and not writer.is_blocked("acme")
    ids = sorted(r["request_id"] for r in ledger.query())
    assert len(ids) == 3 and ids[0] == "dup" and ids[1].startswith("dup#") and ids[2] == "r2"
