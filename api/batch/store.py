"""Batch state in SQLite: files, batches and one row per line, so a killed server resumes where it stopped.

A line is `pending` until its result is committed (`done` or `failed`); a server killed mid-line finds it
pending at the next start and runs it again. Its usage row is keyed by batch and line (`billing_key`), so the
ledger keeps only the first. WAL, synchronous NORMAL (the SQLite ledger's default durability).

The file is `$LORAPLEX_HOME/batches.sqlite` unless `--batch-store-path` names another; it is SQLite and per server
whatever the ledger's backend, opened like every store (`adapters.sql`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.home import data_home
from adapters.sql import DB_ERRORS, Database, SchemaTooNew, migrate, open_database

STORE_FILE = "batches.sqlite"
VERSION_TABLE = "batch_schema_version"
LOCK_KEY = "loraplex-batches"
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")
LINE_STATES = ("pending", "done", "failed", "cancelled", "expired")

# Version 1's tables exist in files written before the version table (they recorded PRAGMA user_version), hence
# IF NOT EXISTS.
MIGRATIONS = ["""
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
    failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT,
    reserved_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, created_at);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL,
    state TEXT NOT NULL, status INTEGER, request_id TEXT, response TEXT, error TEXT, finished_at REAL,
    PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS lines_pending ON lines (state, batch_id, line);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, endpoint TEXT NOT NULL, body TEXT NOT NULL, webhook_url TEXT,
    status TEXT NOT NULL, created_at INTEGER NOT NULL, completed_at INTEGER, expires_at REAL,
    status_code INTEGER, result TEXT
);
"""]


class StoreError(Exception):
    pass


def default_store_path() -> Path:
    return data_home() / STORE_FILE


@dataclass(frozen=True)
class LineRow:
    batch_id: str
    line: int
    custom_id: str
    body: dict[str, Any]
    tenant: str
    endpoint: str


@dataclass(frozen=True)
class LineResult:
    """What a finished line left: the response (done) or the error (failed) it will be written out with."""

    state: str  # done | failed
    status: int
    request_id: str
    body: dict[str, Any]


class BatchStore:
    """Thread-safe; every method is one transaction."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._db = open_database(self.path, busy_timeout_s=5.0)
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            migrate(self._db, LOCK_KEY, VERSION_TABLE, MIGRATIONS)
        except (OSError, SchemaTooNew, *DB_ERRORS) as e:
            raise StoreError(f"cannot open batch store {self.path}: {e}") from e

    @contextmanager
    def _tx(self) -> Iterator[Database]:
        """One write transaction (rolled back on any error)."""
        try:
            with self._db.write(LOCK_KEY) as db:
                yield db
        except DB_ERRORS as e:
            raise StoreError(f"batch store write failed: {e}") from e

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------------ files

    def add_file(self, file_id: str, tenant: str, purpose: str, filename: str, size: int) -> dict:
        with self._tx() as conn:
            conn.execute("INSERT INTO files (id, tenant, purpose, filename, bytes, created_at) VALUES (?,?,?,?,?,?)",
                         (file_id, tenant, purpose, filename, size, int(time.time())))
        return self.file(file_id, tenant)

    def put_file(self, file_id: str, tenant: str, purpose: str, filename: str, size: int) -> None:
        """Adds or replaces (a finalize resumed after a crash writes its files again)."""
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO files (id, tenant, purpose, filename, bytes, created_at) "
                         "VALUES (?,?,?,?,?,?)", (file_id, tenant, purpose, filename, size, int(time.time())))

    def file(self, file_id: str, tenant: str) -> dict | None:
        """The tenant's file (None for another tenant's: the same answer as for no file)."""
        return self._one("SELECT * FROM files WHERE id = ? AND tenant = ? AND deleted = 0", (file_id, tenant))

    def files(self, tenant: str, limit: int) -> list[dict]:
        return self._all("SELECT * FROM files WHERE tenant = ? AND deleted = 0 ORDER BY created_at DESC, id "
                         "LIMIT ?", (tenant, limit))

    def delete_file(self, file_id: str, tenant: str) -> bool:
        with self._tx() as conn:
            cursor = conn.execute("UPDATE files SET deleted = 1 WHERE id = ? AND tenant = ? AND deleted = 0",
                                  (file_id, tenant))
        return cursor.rowcount == 1

    # ------------------------------------------------------------------ batches

    def add_batch(self, row: dict) -> None:
        keys = ", ".join(row)
        with self._tx() as conn:
            conn.execute(f"INSERT INTO batches ({keys}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))

    def batch(self, batch_id: str, tenant: str | None = None) -> dict | None:
        if tenant is None:
            return self._one("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return self._one("SELECT * FROM batches WHERE id = ? AND tenant = ?", (batch_id, tenant))

    def batches(self, tenant: str | None, after: str | None, limit: int) -> list[dict]:
        """Newest first (insertion order); `after` is the id of the last batch of the previous page."""
        where, params = [], []
        if tenant is not None:
            where.append("tenant = ?")
            params.append(tenant)
        if after is not None:
            where.append("rowid < (SELECT rowid FROM batches WHERE id = ?)")
            params.append(after)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._all(f"SELECT * FROM batches{clause} ORDER BY rowid DESC LIMIT ?", (*params, limit))

    def unfinished(self) -> list[dict]:
        marks = ", ".join("?" * len(UNFINISHED))
        return self._all(f"SELECT * FROM batches WHERE status IN ({marks}) ORDER BY rowid", UNFINISHED)

    def set_status(self, batch_id: str, status: str, when_column: str | None = None, *, only_from: tuple = (),
                   **fields: Any) -> bool:
        """Moves the batch to `status` (and stamps `when_column`), only from one of `only_from` when given."""
        values = {"status": status, **fields}
        if when_column is not None:
            values[when_column] = int(time.time())
        sets = ", ".join(f"{k} = ?" for k in values)
        sql, params = f"UPDATE batches SET {sets} WHERE id = ?", [*values.values(), batch_id]
        if only_from:
            sql += f" AND status IN ({', '.join('?' * len(only_from))})"
            params += list(only_from)
        with self._tx() as conn:
            return conn.execute(sql, params).rowcount == 1

    def start(self, batch_id: str, lines: list[tuple[int, str, dict]], reserved_tokens: int) -> bool:
        """validating -> in_progress with its lines, in one transaction; False if it was cancelled meanwhile."""
        with self._tx() as conn:
            moved = conn.execute("UPDATE batches SET status = 'in_progress', in_progress_at = ?, reserved_tokens = ? "
                                 "WHERE id = ? AND status = 'validating'",
                                 (int(time.time()), reserved_tokens, batch_id)).rowcount
            if not moved:
                return False
            conn.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
            conn.execute_many("INSERT INTO lines (batch_id, line, custom_id, body, state) VALUES (?,?,?,?,'pending')",
                              [(batch_id, n, cid, json.dumps(body)) for n, cid, body in lines])
        return True

    def reserved_tokens(self, tenant: str) -> int:
        """Tokens of the tenant's batches still to run (validated, unfinished)."""
        row = self._one("SELECT COALESCE(SUM(reserved_tokens), 0) AS n FROM batches WHERE tenant = ? AND status IN "
                        "('in_progress', 'finalizing', 'cancelling')", (tenant,))
        return row["n"]

    # ------------------------------------------------------------------ lines

    def pending_lines(self, limit: int, skip: set[tuple[str, int]]) -> list[LineRow]:
        """Pending lines of in-progress batches, oldest batch first, up to `limit` not in `skip`."""
        rows = self._all(
            "SELECT l.batch_id, l.line, l.custom_id, l.body, b.tenant, b.endpoint FROM lines l "
            "JOIN batches b ON b.id = l.batch_id WHERE l.state = 'pending' AND b.status = 'in_progress' "
            "ORDER BY b.rowid, l.line LIMIT ?", (limit + len(skip),))
        out = [LineRow(r["batch_id"], r["line"], r["custom_id"], json.loads(r["body"]), r["tenant"], r["endpoint"])
               for r in rows if (r["batch_id"], r["line"]) not in skip]
        return out[:limit]

    def finish_line(self, batch_id: str, line: int, result: LineResult) -> bool:
        """Commits a line's result once; False when it was not pending (cancelled meanwhile, or already done)."""
        with self._tx() as conn:
            return conn.execute(
                "UPDATE lines SET state = ?, status = ?, request_id = ?, response = ?, finished_at = ? "
                "WHERE batch_id = ? AND line = ? AND state = 'pending'",
                (result.state, result.status, result.request_id, json.dumps(result.body), time.time(), batch_id,
                 line)).rowcount == 1

    def close_pending(self, batch_id: str, state: str, keep: set[int] = frozenset()) -> int:
        """Lines not run yet, other than those in `keep` (running), become `cancelled` or `expired`."""
        marks = ", ".join("?" * len(keep))
        exclude = f" AND line NOT IN ({marks})" if keep else ""
        with self._tx() as conn:
            return conn.execute(f"UPDATE lines SET state = ?, finished_at = ? WHERE batch_id = ? AND state = 'pending'"
                                f"{exclude}", (state, time.time(), batch_id, *sorted(keep))).rowcount

    def counts(self, batch_id: str) -> dict[str, int]:
        rows = self._all("SELECT state, COUNT(*) AS n FROM lines WHERE batch_id = ? GROUP BY state", (batch_id,))
        counts = {state: 0 for state in LINE_STATES}
        counts.update({r["state"]: r["n"] for r in rows})
        return counts

    def all_counts(self) -> dict[str, dict[str, int]]:
        """Line counts by state of every unfinished batch, for metrics and the dashboard."""
        rows = self._all("SELECT l.batch_id, l.state, COUNT(*) AS n FROM lines l JOIN batches b ON b.id = l.batch_id "
                         "WHERE b.status IN ('in_progress', 'finalizing', 'cancelling') GROUP BY l.batch_id, l.state",
                         ())
        out: dict[str, dict[str, int]] = {}
        for r in rows:
            out.setdefault(r["batch_id"], {s: 0 for s in LINE_STATES})[r["state"]] = r["n"]
        return out

    def status_counts(self) -> dict[str, int]:
        return {r["status"]: r["n"] for r in self._all("SELECT status, COUNT(*) AS n FROM batches GROUP BY status", ())}

    def finished_lines(self, batch_id: str) -> list[dict]:
        return self._all("SELECT line, custom_id, state, status, request_id, response FROM lines WHERE batch_id = ? "
                         "AND state != 'pending' ORDER BY line", (batch_id,))

    # ------------------------------------------------------------------ async jobs

    def add_job(self, job_id: str, tenant: str, endpoint: str, body: dict, webhook_url: str | None) -> None:
        with self._tx() as conn:
            conn.execute("INSERT INTO jobs (id, tenant, endpoint, body, webhook_url, status, created_at) "
                         "VALUES (?,?,?,?,?,'queued',?)",
                         (job_id, tenant, endpoint, json.dumps(body), webhook_url, int(time.time())))

    def job(self, job_id: str, tenant: str | None = None) -> dict | None:
        if tenant is None:
            return self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return self._one("SELECT * FROM jobs WHERE id = ? AND tenant = ?", (job_id, tenant))

    def unfinished_jobs(self) -> list[dict]:
        return self._all("SELECT * FROM jobs WHERE status IN ('queued', 'in_progress') ORDER BY rowid", ())

    def set_job_status(self, job_id: str, status: str) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE jobs SET status = ? WHERE id = ?", (status, job_id))

    def finish_job(self, job_id: str, result: LineResult, keep_s: float) -> bool:
        now = time.time()
        status = "completed" if result.state == "done" else "failed"
        with self._tx() as conn:
            return conn.execute(
                "UPDATE jobs SET status = ?, status_code = ?, result = ?, completed_at = ?, expires_at = ? "
                "WHERE id = ? AND status IN ('queued', 'in_progress')",
                (status, result.status, json.dumps(result.body), int(now), now + keep_s, job_id)).rowcount == 1

    def purge_jobs(self, now: float) -> int:
        """Drops finished jobs whose results are past their keeping time."""
        with self._tx() as conn:
            return conn.execute("DELETE FROM jobs WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)).rowcount

    # ------------------------------------------------------------------ reads

    def _one(self, sql: str, params: tuple) -> dict | None:
        rows = self._all(sql, params)
        return rows[0] if rows else None

    def _all(self, sql: str, params: tuple) -> list[dict]:
        try:
            return self._db.fetch_dicts(sql, params)
        except DB_ERRORS as e:
            raise StoreError(f"cannot read batch store {self.path}: {e}") from e
