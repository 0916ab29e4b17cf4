from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from adapters.sql import SchemaTooNew, is_postgres_url, migrate, open_database, redact, sqlite_path


@pytest.mark.parametrize(("url", "postgres"), [
    ("postgresql://u@h/db", True), ("postgres://u:p@h:5432/db", True), ("/var/lib/x.sqlite", False),
    ("sqlite:///tmp/x.sqlite", False), ("relative/x.sqlite", False),
])
def test_is_postgres_url(url, postgres):
    assert is_postgres_url(url) is postgres


@pytest.mark.parametrize(("url", "path"), [
    ("sqlite:///tmp/x.sqlite", Path("/tmp/x.sqlite")), ("/a/b.sqlite", Path("/a/b.sqlite")),
    (Path("c.sqlite"), Path("c.sqlite")),
])
def test_sqlite_path(url, path):
    assert sqlite_path(url) == path


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
])
def test_redact(url, shown):
    assert redact(url) == shown


def test_migrations_apply_once_in_order_and_refuse_a_newer_schema(database_url):
    migrations = ["CREATE TABLE a (id {id}, x {float})", "CREATE TABLE b (y INTEGER)"]
    db = open_database(database_url)
    try:
        assert migrate(db, "k", "v", migrations[:1]) == 1
        db.execute("INSERT INTO a (x) VALUES (?)", (1.5,))
        assert migrate(db, "k", "v", migrations) == 2  # only the new one runs: a keeps its row
        assert db.execute("SELECT x FROM a").fetchall() == [(1.5,)]
        with pytest.raises(SchemaTooNew, match="up to 1"):
            migrate(db, "k", "v", migrations[:1])
    finally:
        db.close()


def test_a_connection_lost_inside_a_transaction_fails_it_whole(postgres_server):
    db = open_database(postgres_server.new_database())
    try:
        db.execute("CREATE TABLE t (x INTEGER)")
        pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]
        with pytest.raises(psycopg.OperationalError):
            with db.write("k"):
                db.execute("INSERT INTO t VALUES (1)")
                with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                db.execute("INSERT INTO t VALUES (2)")  # not run on a fresh connection, outside the transaction
        assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 0  # the next call reconnects
    finally:
        db.close()
