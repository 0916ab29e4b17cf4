from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psycopg
import pytest

from api.observability.outcome import RequestOutcome
from api.tenancy.ledger import SCHEMA_VERSION, LedgerError, UsageLedger

REPO = Path(__file__).resolve().parents[3]


def outcome(request_id: str, tenant: str = "acme", model: str = "sql-helper", version: str = "2",
            prompt: int = 10, completion: int = 5, status: int = 200, at: float = 1000.0,
            price: float = 0.01, cost: float = 0.002, route: str = "") -> RequestOutcome:
    return RequestOutcome(
        request_id=request_id, tenant=tenant, priority="standard", model=model, version=version, status=status,
        prompt_tokens=prompt, completion_tokens=completion, queue_seconds=0.05, ttft_seconds=0.1,
        e2e_seconds=0.5, inter_token_seconds=(0.1,), price_usd=price, cost_usd=cost, finished_at=at, route=route,
    )


@pytest.fixture
def ledger(database_url):
    with UsageLedger(database_url) as ledger:
        yield ledger


@pytest.fixture
def filled(ledger):
    ledger.record(outcome("r1", at=1000), "stop")
    ledger.record(outcome("r2", at=1010, prompt=20, completion=0, status=500, price=0.0, cost=0.001), "error")
    ledger.record(outcome("r3", tenant="hobby", model="base-model", version="", at=1020, price=0.02), "length")
    ledger.record(outcome("r4", version="3", at=2000, price=0.03), "stop")
    return ledger


def test_creates_directories_in_wal_mode(tmp_path):
    path = tmp_path / "a" / "b" / "usage.sqlite"
    with UsageLedger(path, synchronous="FULL") as ledger:
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT version FROM usage_schema_version").fetchall() == [(SCHEMA_VERSION,)]
    with UsageLedger(path) as ledger:
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_a_ledger_versioned_before_the_schema_table_opens(tmp_path):
    path = tmp_path / "usage.sqlite"
    UsageLedger(path).close()
    with sqlite3.connect(path) as raw:  # as loraplex wrote it before: the version in user_version only
        raw.execute("DROP TABLE usage_schema_version")
        raw.execute("ALTER TABLE usage DROP COLUMN route")
        raw.execute("PRAGMA user_version = 1")
    with pytest.raises(LedgerError, match="schema version 1"):
        UsageLedger.reader(path)  # a reader never migrates
    with UsageLedger(path) as ledger:
        assert ledger.record(outcome("r1"), "stop") and ledger.count() == 1
    with UsageLedger.reader(path) as reader:
        assert reader.count() == 1


def test_rejects_unknown_synchronous(tmp_path):
    with pytest.raises(ValueError):
        UsageLedger(tmp_path / "u.sqlite", synchronous="OFF")


def test_record_stores_every_field(ledger):
    assert ledger.record(outcome("req-1", route="direct;fallback_from=sql-helper@2;reason=load_failed"), "stop")
    assert ledger.query() == [{
        "request_id": "req-1", "tenant": "acme", "priority": "standard", "model": "sql-helper", "version": "2",
        "prompt_tokens": 10, "completion_tokens": 5, "queue_s": 0.05, "ttft_s": 0.1, "e2e_s": 0.5,
        "status": 200, "finish": "stop", "price_usd": 0.01, "cost_usd": 0.002, "created_at": 1000.0,
        "route": "direct;fallback_from=sql-helper@2;reason=load_failed",
    }]


def test_a_request_is_recorded_once(ledger):
    assert ledger.record(outcome("same"), "stop")
    assert not ledger.record(outcome("same", prompt=99), "stop")
    assert ledger.count() == 1 and ledger.query()[0]["prompt_tokens"] == 10


@pytest.mark.parametrize(("filters", "ids"), [
    ({}, ["r1", "r2", "r3", "r4"]),
    ({"tenant": "acme"}, ["r1", "r2", "r4"]),
    ({"model": "base-model"}, ["r3"]),
    ({"since": 1010}, ["r2", "r3", "r4"]),
    ({"until": 1010}, ["r1"]),
    ({"since": 1005, "until": 1500, "tenant": "acme"}, ["r2"]),
    ({"limit": 2}, ["r1", "r2"]),
    ({"tenant": "nobody"}, []),
])
def test_query_filters(filled, filters, ids):
    assert [r["request_id"] for r in filled.query(**filters)] == ids


def test_summary_groups_by_tenant_model_version(filled):
    rows = filled.summary()
    assert [(r["tenant"], r["model"], r["version"]) for r in rows] == [
        ("acme", "sql-helper", "2"), ("acme", "sql-helper", "3"), ("hobby", "base-model", "")]
    acme2 = rows[0]
    assert (acme2["requests"], acme2["prompt_tokens"], acme2["completion_tokens"], acme2["errors"]) == (2, 30, 5, 1)
    assert acme2["price_usd"] == pytest.approx(0.01)
    assert acme2["cost_usd"] == pytest.approx(0.003)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"group_by": ("tenant",)}, [("acme", 3), ("hobby", 1)]),
    ({"group_by": ("tenant",), "since": 1500}, [("acme", 1)]),
    ({"group_by": ("finish",)}, [("error", 1), ("length", 1), ("stop", 2)]),
    ({"group_by": ("tenant",), "tenant": "nobody"}, []),
])
def test_summary_filters_and_groupings(filled, kwargs, expected):
    key = kwargs["group_by"][0]
    assert [(r[key], r["requests"]) for r in filled.summary(**kwargs)] == expected


def test_summary_without_grouping_is_the_total(filled):
    (total,) = filled.summary(group_by=())
    assert (total["requests"], total["errors"]) == (4, 1)
    assert filled.summary(group_by=(), tenant="nobody") == []


def test_summary_refuses_unknown_columns(filled):
    with pytest.raises(ValueError, match="cannot group by"):
        filled.summary(group_by=("tenant; DROP TABLE usage",))


def test_tokens_in(filled):
    assert filled.tokens_in("acme", 0) == 15 + 20 + 15
    assert filled.tokens_in("acme", 1500) == 15
    assert filled.tokens_in("hobby", 1021) == 0
    assert filled.tokens_in("nobody", 0) == 0


def test_record_from_many_threads(ledger):
    def worker(t: int) -> None:
        for i in range(25):
            ledger.record(outcome(f"t{t}-{i}"), "stop")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.count() == 200


def test_reader_sees_committed_rows_while_the_writer_is_open(ledger):
    ledger.record(outcome("a"), "stop")
    with UsageLedger.reader(ledger.url) as reader:
        assert reader.count() == 1
        ledger.record(outcome("b"), "stop")
        assert reader.count() == 2
        with pytest.raises(LedgerError, match="read-only"):
            reader.record(outcome("c"), "stop")


def test_reader_of_a_missing_ledger(tmp_path):
    with pytest.raises(LedgerError, match="no usage ledger"):
        UsageLedger.reader(tmp_path / "absent.sqlite")


def test_refuses_a_newer_schema(database_url):
    with UsageLedger(database_url) as ledger:
        ledger._db.execute("UPDATE usage_schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(LedgerError, match="up to"):
        UsageLedger(database_url)
    with pytest.raises(LedgerError, match="schema version"):
        UsageLedger.reader(database_url)


def test_committed_rows_survive_kill_9(database_url):
    path = database_url
    script = textwrap.dedent(f"""
        import os, signal
        from api.observability.outcome import RequestOutcome
        from api.tenancy.ledger import UsageLedger

        ledger = UsageLedger({path!r})
        for i in range(50):
            request_id = f"req-{{i}}"
            ledger.record(RequestOutcome(request_id, "acme", "standard", "m", "", 200, 3, 4, 0.0, 0.1, 0.2,
                                         (), 0.0, 0.0, 1000.0 + i), "stop")
            print(request_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    printed = done.stdout.split()
    assert len(printed) == 50
    with UsageLedger.reader(path) as reader:
        assert sorted(r["request_id"] for r in reader.query()) == sorted(printed)


def test_a_lost_postgresql_connection_fails_one_write_and_the_retry_reconnects(postgres_server):
    with UsageLedger(postgres_server.new_database()) as ledger:
        ledger.record(outcome("before"), "stop")
        pid = ledger._db.execute("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(LedgerError, match="cannot record request lost"):
            ledger.record(outcome("lost"), "stop")
        assert ledger.record(outcome("lost"), "stop")  # what LedgerWriter's retry does
        assert [r["request_id"] for r in ledger.query()] == ["before", "lost"]


def test_a_version_1_ledger_gains_the_route_column(tmp_path):
    path = tmp_path / "usage.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE usage (id INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL, "
                    "priority TEXT NOT NULL, model TEXT NOT NULL, version TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, "
                    "completion_tokens INTEGER NOT NULL, queue_s REAL NOT NULL, ttft_s REAL, e2e_s REAL NOT NULL, "
                    "status INTEGER NOT NULL, finish TEXT NOT NULL, price_usd REAL NOT NULL, cost_usd REAL NOT NULL, "
                    "created_at REAL NOT NULL)")
        raw.execute("INSERT INTO usage VALUES (1, 'old', 'acme', 'standard', 'm', '', 1, 1, 0, 0, 0, 200, 'stop', 0, "
                    "0, 5)")
        raw.execute("PRAGMA user_version = 1")
    with UsageLedger(path) as ledger:
        assert ledger.record(outcome("new", route="canary;arm=candidate;rollout=1"), "stop")
        assert [(r["request_id"], r["route"]) for r in ledger.query()] == [
            ("old", ""), ("new", "canary;arm=candidate;rollout=1")]


def test_record_many_commits_every_row_or_none(ledger):
    ledger.record(outcome("taken"), "stop")
    renamed = []

    def on_conflict(o):
        renamed.append(o.request_id)
        return dataclasses.replace(o, request_id=f"{o.request_id}#2")

    ledger.record_many([(outcome("a"), "stop"), (outcome("taken"), "stop")], on_conflict)
    assert renamed == ["taken"]
    assert sorted(r["request_id"] for r in ledger.query()) == ["a", "taken", "taken#2"]
    broken = outcome("c", tenant=None)  # NOT NULL: its insert fails mid-transaction
    with pytest.raises(LedgerError, match="b, c, d"):
        ledger.record_many([(outcome("b"), "stop"), (broken, "stop"), (outcome("d"), "stop")], lambda o: None)
    assert ledger.count() == 3
    ledger.record_many([(outcome("a", prompt=99), "stop")], lambda o: None)  # a key taken: dropped
    assert ledger.count() == 3 and [r["prompt_tokens"] for r in ledger.query() if r["request_id"] == "a"] == [10]
