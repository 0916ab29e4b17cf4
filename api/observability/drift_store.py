"""Drift windows in SQLite, so a version's reference (its first sequences, or a pinned window) and its current
window survive a restart: loaded at start, saved every `SAVE_INTERVAL_S` while they change and at shutdown."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.sql import DB_ERRORS, SchemaTooNew, migrate, open_database
from api.observability.drift import DriftSample, WindowState

DRIFT_FILE = "drift.sqlite"
SAVE_INTERVAL_S = 10.0
VERSION_TABLE = "drift_schema_version"
LOCK_KEY = "loraplex-drift"
# Version 1 is the table files written before the version table already have, hence IF NOT EXISTS.
MIGRATIONS = ["""
CREATE TABLE IF NOT EXISTS drift_windows (
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    pinned INTEGER NOT NULL,
    reference TEXT NOT NULL,  -- JSON: [[prompt_tokens, output_tokens, mean_logprob|null, finish_reason, [token ids]]]
    current TEXT NOT NULL,
    PRIMARY KEY (model, version)
)
"""]


class DriftStoreError(Exception):
    pass


def _encode(samples: list[DriftSample]) -> str:
    return json.dumps([[s.prompt_tokens, s.output_tokens, s.mean_logprob, s.finish_reason, list(s.output_token_ids)]
                       for s in samples])


def _decode(text: str) -> list[DriftSample]:
    return [DriftSample(p, o, m, f, tuple(t)) for p, o, m, f, t in json.loads(text)]


class DriftStore:
    """One SQLite file (WAL), opened like every store (`adapters.sql`); `save` replaces every row in one
    transaction. Thread-safe."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._db = open_database(self.path, busy_timeout_s=5.0)
            self._db.execute("PRAGMA journal_mode = WAL")
            migrate(self._db, LOCK_KEY, VERSION_TABLE, MIGRATIONS)
        except (OSError, SchemaTooNew, *DB_ERRORS) as e:
            raise DriftStoreError(f"cannot open drift store {self.path}: {e}") from e

    def load(self) -> dict[tuple[str, str], WindowState]:
        with self._db.read() as db:
            rows = db.execute("SELECT model, version, pinned, reference, current FROM drift_windows").fetchall()
        return {(model, version): WindowState(_decode(reference), _decode(current), bool(pinned))
                for model, version, pinned, reference, current in rows}

    def save(self, states: dict[tuple[str, str], WindowState]) -> None:
        rows = [(model, version, int(s.pinned), _encode(s.reference), _encode(s.current))
                for (model, version), s in states.items()]
        try:
            with self._db.write(LOCK_KEY) as db:
                db.execute("DELETE FROM drift_windows")
                db.execute_many("INSERT INTO drift_windows VALUES (?, ?, ?, ?, ?)", rows)
        except DB_ERRORS as e:
            raise DriftStoreError(f"cannot save drift windows to {self.path}: {e}") from e

    def close(self) -> None:
        self._db.close()
