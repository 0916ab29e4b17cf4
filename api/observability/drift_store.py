"""Drift windows in SQLite, so a version's reference (its first sequences, or a pinned window) and its current
window survive a restart: loaded at start, saved every `SAVE_INTERVAL_S` while they change and at shutdown."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from api.observability.drift import DriftSample, WindowState

DRIFT_FILE = "drift.sqlite"
SAVE_INTERVAL_S = 10.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS drift_windows (
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    pinned INTEGER NOT NULL,
    reference TEXT NOT NULL,  -- JSON: [[prompt_tokens, output_tokens, mean_logprob|null, finish_reason, [token ids]]]
    current TEXT NOT NULL,
    PRIMARY KEY (model, version)
)
"""


class DriftStoreError(Exception):
    pass


def _encode(samples: list[DriftSample]) -> str:
    return json.dumps([[s.prompt_tokens, s.output_tokens, s.mean_logprob, s.finish_reason, list(s.output_token_ids)]
                       for s in samples])


def _decode(text: str) -> list[DriftSample]:
    return [DriftSample(p, o, m, f, tuple(t)) for p, o, m, f, t in json.loads(text)]


class DriftStore:
    """One SQLite file (WAL); `save` replaces every row in one transaction. Thread-safe."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 5000")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise DriftStoreError(f"cannot open drift store {self.path}: {e}") from e

    def load(self) -> dict[tuple[str, str], WindowState]:
        with self._lock:
            rows = self._conn.execute("SELECT model, version, pinned, reference, current FROM drift_windows").fetchall()
        return {(model, version): WindowState(_decode(reference), _decode(current), bool(pinned))
                for model, version, pinned, reference, current in rows}

    def save(self, states: dict[tuple[str, str], WindowState]) -> None:
        rows = [(model, version, int(s.pinned), _encode(s.reference), _encode(s.current))
                for (model, version), s in states.items()]
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.execute("DELETE FROM drift_windows")
                self._conn.executemany("INSERT INTO drift_windows VALUES (?, ?, ?, ?, ?)", rows)
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._conn.execute("ROLLBACK")
                raise DriftStoreError(f"cannot save drift windows to {self.path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            self._conn.close()
