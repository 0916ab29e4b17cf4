"""Stored responses, per tenant, in the server's database: the usage ledger's (`--ledger-url`: SQLite by default,
PostgreSQL where replicas share it, so a `previous_response_id` made on one replica is found on another).

A row holds the response as returned and the conversation it closes (the chat messages a next turn that names it
continues from: earlier turns, this turn's input, its output; never the instructions, which apply to one turn).
Every read and delete names the tenant: a tenant never reads another's. Rows stay until deleted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from adapters.sql import Database, migrate, open_database

LOCK_KEY = "loraplex-responses"
VERSION_TABLE = "responses_schema"
MIGRATIONS = ("""
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at {float} NOT NULL, response TEXT NOT NULL,
    conversation TEXT NOT NULL
)
""",)


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    """Thread-safe (one connection behind the database's lock); callers on the event loop use a worker thread."""

    def __init__(self, url: str):
        self._db: Database = open_database(url, busy_timeout_s=5.0)
        if self._db.dialect == "sqlite":
            self._db.execute("PRAGMA journal_mode = WAL")
        migrate(self._db, LOCK_KEY, VERSION_TABLE, MIGRATIONS)

    def put(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._db.execute("INSERT INTO responses (id, tenant, created_at, response, conversation) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (response["id"], tenant, time.time(), json.dumps(response), json.dumps(conversation)))

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        rows = self._db.fetch_dicts("SELECT response, conversation FROM responses WHERE id = ? AND tenant = ?",
                                    (response_id, tenant))
        if not rows:
            return None
        return StoredResponse(json.loads(rows[0]["response"]), json.loads(rows[0]["conversation"]))

    def delete(self, tenant: str, response_id: str) -> bool:
        cursor = self._db.execute("DELETE FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant))
        return cursor.rowcount > 0

    def close(self) -> None:
        self._db.close()
