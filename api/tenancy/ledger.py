"""The usage ledger: one SQLite row per finished request, committed before `record` returns.

Durability: the database runs in WAL mode. With `synchronous=NORMAL` (default) a committed row is in
the WAL file in the OS page cache before `record` returns, so it survives the server being killed
(kill -9, OOM) but the last commits may be lost if the machine loses power. `synchronous=FULL` syncs
the WAL to disk on every commit and survives power loss too, at the cost of one fsync per request.
Other processes (`loraplex usage`) read the file while the server writes, through `UsageLedger.reader`.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Literal

from adapters.home import data_home
from api.observability.outcome import RequestOutcome

SCHEMA_VERSION = 2  # 2: `route` (the routing step's decision and any fallback taken)
LEDGER_FILE = "usage.sqlite"
GROUP_COLUMNS = ("tenant", "model", "version", "priority", "status", "finish")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    priority TEXT NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    queue_s REAL NOT NULL,
    ttft_s REAL,
    e2e_s REAL NOT NULL,
    status INTEGER NOT NULL,
    finish TEXT NOT NULL,
    price_usd REAL NOT NULL,
    cost_usd REAL NOT NULL,
    created_at REAL NOT NULL,
    route TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS usage_tenant_created ON usage (tenant, created_at);
CREATE INDEX IF NOT EXISTS usage_created ON usage (created_at);
"""

_COLUMNS = ("request_id", "tenant", "priority", "model", "version", "prompt_tokens", "completion_tokens",
            "queue_s", "ttft_s", "e2e_s", "status", "finish", "price_usd", "cost_usd", "created_at", "route")


class LedgerError(Exception):
    pass


def default_ledger_path() -> Path:
    """`$LORAPLEX_HOME/usage.sqlite`, shared by the server and `loraplex usage`."""
    return data_home() / LEDGER_FILE


class UsageLedger:
    """Writer (the server) or, via `reader`, a read-only view for another process. Thread-safe."""

    def __init__(self, path: str | Path, synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
                 read_only: bool = False):
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._conn = self._open_reader() if read_only else self._open_writer(synchronous)

    @classmethod
    def reader(cls, path: str | Path) -> UsageLedger:
        """Open an existing ledger read-only; safe while a server process writes it."""
        return cls(path, read_only=True)

    def _open_writer(self, synchronous: str) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"cannot open usage ledger {self.path}: {e}") from e
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise LedgerError(f"usage ledger {self.path}: WAL mode refused (journal_mode={mode})")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._migrate(conn)
        except sqlite3.Error as e:
            conn.close()
            raise LedgerError(f"cannot open usage ledger {self.path}: {e}") from e
        except LedgerError:
            conn.close()
            raise
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise LedgerError(f"no usage ledger at {self.path}")
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                   isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 5000")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as e:
            raise LedgerError(f"cannot read usage ledger {self.path}: {e}") from e
        if version != SCHEMA_VERSION:
            conn.close()
            raise LedgerError(f"usage ledger {self.path} has schema version {version}, this loraplex reads "
                              f"{SCHEMA_VERSION}")
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")  # re-read under the write lock: two servers may start together
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LedgerError(f"schema version {version} is newer than this loraplex ({SCHEMA_VERSION})")
            if version < SCHEMA_VERSION:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(statement)
                if version == 1:
                    conn.execute("ALTER TABLE usage ADD COLUMN route TEXT NOT NULL DEFAULT ''")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> UsageLedger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def record(self, outcome: RequestOutcome, finish: str) -> bool:
        """Insert and commit one row; False when this request id is already recorded."""
        if self.read_only:
            raise LedgerError(f"usage ledger {self.path} was opened read-only")
        row = (outcome.request_id, outcome.tenant, outcome.priority, outcome.model, outcome.version,
               outcome.prompt_tokens, outcome.completion_tokens, outcome.queue_seconds, outcome.ttft_seconds,
               outcome.e2e_seconds, outcome.status, finish, outcome.price_usd, outcome.cost_usd,
               outcome.finished_at, outcome.route)
        sql = (f"INSERT OR IGNORE INTO usage ({', '.join(_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(_COLUMNS))})")
        try:
            with self._lock:
                cursor = self._conn.execute(sql, row)  # autocommit: committed when execute returns
        except sqlite3.Error as e:
            raise LedgerError(f"cannot record request {outcome.request_id} in {self.path}: {e}") from e
        return cursor.rowcount == 1

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
               "COALESCE(SUM(status >= 500), 0) AS errors "
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
                cursor = self._conn.execute(sql, params)
                names = [d[0] for d in cursor.description]
                return [dict(zip(names, row)) for row in cursor.fetchall()]
        except sqlite3.Error as e:
            raise LedgerError(f"cannot read usage ledger {self.path}: {e}") from e


def _filters(tenant: str | None, model: str | None, since: float | None, until: float | None,
             ) -> tuple[str, tuple]:
    clauses, params = [], []
    for clause, value in (("tenant = ?", tenant), ("model = ?", model), ("created_at >= ?", since),
                          ("created_at < ?", until)):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)
