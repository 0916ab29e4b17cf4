"""The usage ledger: one row per finished request, committed before `record` returns, in SQLite (one machine)
or PostgreSQL (one ledger that every replica writes and every operator queries); same schema and queries.

Durability, SQLite: the database runs in WAL mode. With `synchronous=NORMAL` (default) a committed row is in
the WAL file in the OS page cache before `record` returns, so it survives the server being killed
(kill -9, OOM) but the last commits may be lost if the machine loses power. `synchronous=FULL` syncs
the WAL to disk on every commit and survives power loss too, at the cost of one fsync per request.
PostgreSQL: `record` returns after the server acknowledged the commit (durable as the server is configured,
`synchronous_commit`); `synchronous` does not apply.
Other processes (`loraplex usage`) read while the server writes, through `UsageLedger.reader`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from adapters.home import data_home
from adapters.sql import DB_ERRORS, Database, SchemaTooNew, migrate, open_database, schema_version, sqlite_path
from api.observability.outcome import RequestOutcome

LEDGER_FILE = "usage.sqlite"
GROUP_COLUMNS = ("tenant", "model", "version", "priority", "status", "finish")
LOCK_KEY = "loraplex.ledger"
VERSION_TABLE = "usage_schema_version"

# Version v is MIGRATIONS[v - 1]; add a migration, never edit one that shipped.
MIGRATIONS = ("""
CREATE TABLE IF NOT EXISTS usage (
    id {id},
    request_id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    priority TEXT NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    queue_s {float} NOT NULL,
    ttft_s {float},
    e2e_s {float} NOT NULL,
    status INTEGER NOT NULL,
    finish TEXT NOT NULL,
    price_usd {float} NOT NULL,
    cost_usd {float} NOT NULL,
    created_at {float} NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_tenant_created ON usage (tenant, created_at);
CREATE INDEX IF NOT EXISTS usage_created ON usage (created_at);
""", """
ALTER TABLE usage ADD COLUMN route TEXT NOT NULL DEFAULT ''
""")  # 2: `route`, the routing step's decision and any fallback taken
SCHEMA_VERSION = len(MIGRATIONS)

_COLUMNS = ("request_id", "tenant", "priority", "model", "version", "prompt_tokens", "completion_tokens",
            "queue_s", "ttft_s", "e2e_s", "status", "finish", "price_usd", "cost_usd", "created_at", "route")
_INSERT = (f"INSERT INTO usage ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
           "ON CONFLICT (request_id) DO NOTHING")


def _row(outcome: RequestOutcome, finish: str) -> tuple:
    """`_COLUMNS` of one outcome."""
    return (outcome.request_id, outcome.tenant, outcome.priority, outcome.model, outcome.version,
            outcome.prompt_tokens, outcome.completion_tokens, outcome.queue_seconds, outcome.ttft_seconds,
            outcome.e2e_seconds, outcome.status, finish, outcome.price_usd, outcome.cost_usd, outcome.finished_at,
            outcome.route)


class LedgerError(Exception):
    pass


def default_ledger_path() -> Path:
    """`$LORAPLEX_HOME/usage.sqlite`, shared by the server and `loraplex usage`."""
    return data_home() / LEDGER_FILE


class UsageLedger:
    """Writer (the server) or, via `reader`, a read-only view for another process. Thread-safe. `url` is a
    SQLite file (a path or `sqlite:///path`) or a `postgresql://` DSN."""

    def __init__(self, url: str | Path, synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
                 read_only: bool = False):
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.url = str(url)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._db = self._open_reader() if read_only else self._open_writer(synchronous)
        self.where = self._db.where

    @property
    def path(self) -> Path:
        """Where files beside the ledger go (the pending-rows spill file): the SQLite file, or for a server
        ledger a file under $LORAPLEX_HOME."""
        return default_ledger_path() if self._db.dialect == "postgresql" else sqlite_path(self.url)

    @classmethod
    def reader(cls, url: str | Path) -> UsageLedger:
        """Open an existing ledger read-only; safe while a server process writes it."""
        return cls(url, read_only=True)

    def _open_writer(self, synchronous: str) -> Database:
        try:
            db = open_database(self.url, busy_timeout_s=5.0)
        except (OSError, *DB_ERRORS) as e:
            raise LedgerError(f"cannot open usage ledger {self.url}: {e}") from e
        try:
            if db.dialect == "sqlite":
                mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise LedgerError(f"usage ledger {db.where}: WAL mode refused (journal_mode={mode})")
                db.execute(f"PRAGMA synchronous = {synchronous}")
            # Ledgers written before the version table kept their version in SQLite's user_version.
            legacy = db.execute("PRAGMA user_version").fetchone()[0] if db.dialect == "sqlite" else 0
            migrate(db, LOCK_KEY, VERSION_TABLE, MIGRATIONS, legacy_version=legacy)
        except (SchemaTooNew, *DB_ERRORS) as e:
            db.close()
            raise LedgerError(f"cannot open usage ledger {db.where}: {e}") from e
        except LedgerError:
            db.close()
            raise
        return db

    def _open_reader(self) -> Database:
        if "://" not in self.url and not sqlite_path(self.url).is_file():
            raise LedgerError(f"no usage ledger at {self.url}")
        try:
            db = open_database(self.url, read_only=True, busy_timeout_s=5.0)
            version = schema_version(db, VERSION_TABLE)
            if version == 0 and db.dialect == "sqlite":
                version = db.execute("PRAGMA user_version").fetchone()[0]
        except (OSError, *DB_ERRORS) as e:
            raise LedgerError(f"cannot read usage ledger {self.url}: {e}") from e
        if version != SCHEMA_VERSION:
            db.close()
            raise LedgerError(f"usage ledger {db.where} has schema version {version}, this loraplex reads "
                              f"{SCHEMA_VERSION}")
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> UsageLedger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def record(self, outcome: RequestOutcome, finish: str) -> bool:
        """Insert and commit one row; False when this request id is already recorded."""
        self._check_writable()
        try:
            with self._lock:
                cursor = self._db.execute(_INSERT, _row(outcome, finish))  # autocommit: committed on return
        except DB_ERRORS as e:
            raise LedgerError(f"cannot record request {outcome.request_id} in {self.where}: {e}") from e
        return cursor.rowcount == 1

    def record_many(self, rows: Sequence[tuple[RequestOutcome, str]],
                    on_conflict: Callable[[RequestOutcome], RequestOutcome | None]) -> None:
        """Inserts `rows` in one transaction: all are committed or none. A row whose request id is already
        recorded is replaced by `on_conflict(outcome)` (None: dropped), in the same transaction."""
        self._check_writable()
        try:
            with self._lock, self._db.batch() as db:
                for outcome, finish in rows:
                    if db.execute(_INSERT, _row(outcome, finish)).rowcount == 1:
                        continue
                    instead = on_conflict(outcome)
                    if instead is not None:
                        db.execute(_INSERT, _row(instead, finish))
        except DB_ERRORS as e:
            ids = ", ".join(o.request_id for o, _ in rows)
            raise LedgerError(f"cannot record requests {ids} in {self.where}: {e}") from e

    def _check_writable(self) -> None:
        if self.read_only:
            raise LedgerError(f"usage ledger {self.where} was opened read-only")

    def count(self) -> int:
        return self._fetch("SELECT COUNT(*) AS n FROM usage", ())[0]["n"]

    def query(self, tenant: str | None = None, model: str | None = None, since: float | None = None,
              until: float | None = None, limit: int = 1000) -> list[dict]:
        """Rows oldest first; `since` inclusive and `until` exclusive, unix seconds."""
        where, params = _filters(tenant, model, since, until)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM usage{where} ORDER BY created_at, id LIMIT ?"
        return self._fetch(sql, (*params, limit))

    def summary(self, tenant: str | None = None, model: str | None = None, since: float | None = None,
                until: float | None = None, group_by: tuple[str, ...] = ("tenant", "model", "version"),
                ) -> list[dict]:
        """Totals per group; `errors` counts server errors (status >= 500)."""
        unknown = [c for c in group_by if c not in GROUP_COLUMNS]
        if unknown:
            raise ValueError(f"cannot group by {unknown}; choose from {GROUP_COLUMNS}")
        where, params = _filters(tenant, model, since, until)
        keys = ", ".join(group_by)
        sql = (f"SELECT {keys + ', ' if keys else ''}COUNT(*) AS requests, "
               "COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens, "
               "COALESCE(SUM(completion_tokens), 0) AS completion_tokens, "
               "COALESCE(SUM(price_usd), 0.0) AS price_usd, COALESCE(SUM(cost_usd), 0.0) AS cost_usd, "
               "COALESCE(SUM(CASE WHEN status >= 500 THEN 1 ELSE 0 END), 0) AS errors "
               f"FROM usage{where}{' GROUP BY ' + keys + ' ORDER BY ' + keys if keys else ''}")
        rows = self._fetch(sql, params)
        return [r for r in rows if r["requests"]]

    def tokens_in(self, tenant: str, since_wall: float) -> int:
        """Prompt plus completion tokens of `tenant` finished at or after `since_wall`."""
        sql = ("SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) AS n FROM usage "
               "WHERE tenant = ? AND created_at >= ?")
        return self._fetch(sql, (tenant, since_wall))[0]["n"]

    def _fetch(self, sql: str, params: tuple) -> list[dict]:
        try:
            with self._lock:
                return self._db.fetch_dicts(sql, params)
        except DB_ERRORS as e:
            raise LedgerError(f"cannot read usage ledger {self.where}: {e}") from e


def _filters(tenant: str | None, model: str | None, since: float | None, until: float | None,
             ) -> tuple[str, tuple]:
    clauses, params = [], []
    for clause, value in (("tenant = ?", tenant), ("model = ?", model), ("created_at >= ?", since),
                          ("created_at < ?", until)):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)
