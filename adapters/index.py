"""The registry index: adapter versions and aliases in SQLite (WAL; one machine) or PostgreSQL (shared by
replicas), shared by the CLI and running servers. Same schema and queries on both (adapters/sql.py).

Every call is its own transaction, so a server sees what another process published on its next read.
Writers take the write lock up front (SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock), which makes
version allocation and alias moves atomic across processes.

Versions are numbered 1, 2, 3... per name and never reused, even after a delete. A push first reserves a
number (a `pending` row readers ignore), uploads the files, then commits the manifest; an abandoned
reservation just leaves a gap.

Aliases name a version (`NAME:ALIAS`). `stable`, which a bare `NAME` resolves to, points at a name's first
version when it is published; from then on a new version never changes what serves: only promote (or a
rollout's promotion) and rollback move `stable`. Every move of an alias is recorded, and rollback moves it back
to the target it had before the current one. A version that any alias points at cannot be deleted.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from adapters.identity import STABLE, check_alias, check_name, check_version, version_label
from adapters.manifest import Manifest, utc_now
from adapters.sql import Database, SchemaTooNew, migrate, open_database

BUSY_TIMEOUT_S = 30.0
LOCK_KEY = "loraplex.registry"
VERSION_TABLE = "schema_version"

# Version v is MIGRATIONS[v - 1]; add a migration, never edit one that shipped.
MIGRATIONS = ("""
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS adapters (
    name TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    next_version INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL REFERENCES adapters(name),
    version INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'ready')),
    content_hash TEXT,
    manifest_json TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS aliases (
    name TEXT NOT NULL REFERENCES adapters(name),
    alias TEXT NOT NULL,
    version INTEGER NOT NULL,
    explicit INTEGER NOT NULL,
    PRIMARY KEY (name, alias)
);
CREATE TABLE IF NOT EXISTS alias_history (
    id {id},
    name TEXT NOT NULL,
    alias TEXT NOT NULL,
    version INTEGER NOT NULL,
    at TEXT NOT NULL
);
""", """
CREATE TABLE IF NOT EXISTS rollouts (
    id {id},
    name TEXT NOT NULL,
    stable_version INTEGER NOT NULL,
    candidate_version INTEGER NOT NULL,
    percent {float} NOT NULL,
    sticky INTEGER NOT NULL,
    shadow_percent {float} NOT NULL,
    guard_json TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('active', 'promoted', 'aborted', 'rolled_back')),
    reason TEXT NOT NULL DEFAULT '',
    started_at TEXT NOT NULL,
    ended_at TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS one_active_rollout_per_name ON rollouts (name) WHERE state = 'active';
CREATE TABLE IF NOT EXISTS rollout_events (
    id {id},
    rollout_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_requests (
    request_id TEXT PRIMARY KEY,
    rollout_id INTEGER NOT NULL,
    arm TEXT NOT NULL,
    tenant TEXT NOT NULL,
    status INTEGER NOT NULL,
    ttft_s {float},
    tpot_s {float},
    completion_tokens INTEGER NOT NULL,
    cost_usd {float} NOT NULL,
    logprob {float},
    feedback {float},
    at {float} NOT NULL
);
CREATE INDEX IF NOT EXISTS rollout_requests_by_rollout ON rollout_requests (rollout_id);
CREATE TABLE IF NOT EXISTS shadow_results (
    id {id},
    rollout_id INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    status INTEGER NOT NULL,
    exact INTEGER NOT NULL,
    overlap {float} NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd {float} NOT NULL,
    at {float} NOT NULL
);
CREATE INDEX IF NOT EXISTS shadow_results_by_rollout ON shadow_results (rollout_id);
CREATE TABLE IF NOT EXISTS fallbacks (
    name TEXT PRIMARY KEY,
    previous INTEGER NOT NULL,
    base INTEGER NOT NULL
);
""")  # 2: rollouts, their events and outcomes, fallback chains (adapters/rollouts.py)
SCHEMA_VERSION = len(MIGRATIONS)


class VersionNotFound(LookupError):
    """No such adapter, version or alias."""


class RegistryError(ValueError):
    """A registry operation refused because of the registry's state (not because of malformed input)."""


class AliasInUse(RegistryError):
    """A version an alias points at cannot be deleted."""


class NothingToRollBack(RegistryError):
    """The alias has no earlier target."""


class IndexSchemaError(SchemaTooNew):
    """The index was written by a newer loraplex."""


@dataclass(frozen=True)
class Reservation:
    """A version number for a push; `existing` is the newest version when it already has the same content."""

    version: int
    existing: Manifest | None = None


class RegistryIndex:
    """Thread-safe (one connection behind a lock) and multi-process-safe (the database's locking). `url` is a
    SQLite file (a path or `sqlite:///path`) or a `postgresql://` DSN."""

    def __init__(self, url: str | Path):
        self.url = str(url)
        self._db = open_database(url, busy_timeout_s=BUSY_TIMEOUT_S)
        try:
            if self._db.dialect == "sqlite":
                self._db.execute("PRAGMA journal_mode=WAL")
                # Survives a killed process (WAL); a power loss may lose the last commits. The routing step writes
                # a row per routed request (adapters/rollouts.py), and an fsync each would cost milliseconds.
                self._db.execute("PRAGMA synchronous=NORMAL")
            migrate(self._db, LOCK_KEY, VERSION_TABLE, MIGRATIONS)
        except SchemaTooNew as e:
            self._db.close()
            raise IndexSchemaError(f"registry index: {e}") from e

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RegistryIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reading(self) -> AbstractContextManager[Database]:
        """A read transaction: one consistent snapshot, the newest commit of any process. Also for stores that keep
        their tables in the index (adapters/rollouts.py)."""
        return self._db.read()

    def writing(self) -> AbstractContextManager[Database]:
        """A write transaction (the write lock taken up front)."""
        return self._db.write(LOCK_KEY)

    # Versions

    def reserve_version(self, name: str, content_hash: str, description: str = "") -> Reservation:
        """The next version number of `name`, or the newest version if its content is `content_hash`."""
        check_name(name)
        with self.writing() as db:
            db.execute("INSERT INTO adapters (name, description, created_at) VALUES (?, '', ?) "
                       "ON CONFLICT (name) DO NOTHING", (name, utc_now()))
            if description:
                db.execute("UPDATE adapters SET description = ? WHERE name = ?", (description, name))
            newest = db.execute("SELECT manifest_json FROM versions WHERE name = ? AND state = 'ready' "
                                "ORDER BY version DESC LIMIT 1", (name,)).fetchone()
            if newest is not None:
                manifest = Manifest.model_validate_json(newest[0])
                if manifest.content_hash == content_hash:
                    return Reservation(version=manifest.version, existing=manifest)
            (version,) = db.execute("SELECT next_version FROM adapters WHERE name = ?", (name,)).fetchone()
            db.execute("UPDATE adapters SET next_version = ? WHERE name = ?", (version + 1, name))
            db.execute("INSERT INTO versions (name, version, state, created_at) VALUES (?, ?, 'pending', ?)",
                       (name, version, utc_now()))
        return Reservation(version=version)

    def commit_version(self, manifest: Manifest) -> None:
        """Publish a reserved version; the first version of a name becomes its `stable`, later ones do not."""
        with self.writing() as db:
            updated = db.execute(
                "UPDATE versions SET state = 'ready', content_hash = ?, manifest_json = ?, created_at = ? "
                "WHERE name = ? AND version = ? AND state = 'pending'",
                (manifest.content_hash, manifest.model_dump_json(), manifest.created_at, manifest.name,
                 manifest.version)).rowcount
            if updated != 1:
                raise VersionNotFound(f"no reservation for {manifest.name}@{manifest.version}")
            stable = db.execute("SELECT version FROM aliases WHERE name = ? AND alias = ?",
                                (manifest.name, STABLE)).fetchone()
            if stable is None:
                self._move_alias(db, manifest.name, STABLE, manifest.version, explicit=False)

    def release_version(self, name: str, version: int) -> None:
        """Drop a reservation whose upload failed; its number is not reused."""
        with self.writing() as db:
            db.execute("DELETE FROM versions WHERE name = ? AND version = ? AND state = 'pending'", (name, version))

    def add_version(self, manifest: Manifest) -> Manifest:
        """Reserve and commit in one go (for content already stored); returns the manifest as recorded."""
        reservation = self.reserve_version(manifest.name, manifest.content_hash, manifest.description)
        if reservation.existing is not None:
            return reservation.existing
        recorded = manifest.model_copy(update={"version": reservation.version})
        self.commit_version(recorded)
        return recorded

    def get(self, name: str, version: int) -> Manifest:
        with self.reading() as db:
            row = db.execute("SELECT manifest_json FROM versions WHERE name = ? AND version = ? AND state = 'ready'",
                             (name, version)).fetchone()
        if row is None:
            raise VersionNotFound(f"{version_label(name, version)} does not exist")
        return Manifest.model_validate_json(row[0])

    def versions(self, name: str) -> list[Manifest]:
        """Ready versions of `name`, oldest first."""
        with self.reading() as db:
            rows = db.execute("SELECT manifest_json FROM versions WHERE name = ? AND state = 'ready' "
                              "ORDER BY version", (name,)).fetchall()
        return [Manifest.model_validate_json(row[0]) for row in rows]

    def latest(self, name: str) -> Manifest | None:
        versions = self.versions(name)
        return versions[-1] if versions else None

    def names(self) -> list[str]:
        """Names with at least one ready version, sorted."""
        with self.reading() as db:
            rows = db.execute("SELECT DISTINCT name FROM versions WHERE state = 'ready' ORDER BY name").fetchall()
        return [row[0] for row in rows]

    def description(self, name: str) -> str:
        with self.reading() as db:
            row = db.execute("SELECT description FROM adapters WHERE name = ?", (name,)).fetchone()
        return row[0] if row else ""

    def delete_version(self, name: str, version: int) -> None:
        """Remove a version from the index; refused while an alias points at it."""
        with self.writing() as db:
            exists = db.execute("SELECT 1 FROM versions WHERE name = ? AND version = ? AND state = 'ready'",
                                (name, version)).fetchone()
            if exists is None:
                raise VersionNotFound(f"{version_label(name, version)} does not exist")
            held_by = [row[0] for row in db.execute(
                "SELECT alias FROM aliases WHERE name = ? AND version = ? ORDER BY alias", (name, version))]
            if held_by:
                raise AliasInUse(f"{version_label(name, version)} is the target of alias {', '.join(held_by)}; "
                                 f"promote another version to it or roll it back first")
            db.execute("DELETE FROM versions WHERE name = ? AND version = ?", (name, version))
            db.execute("DELETE FROM alias_history WHERE name = ? AND version = ?", (name, version))

    # Aliases

    def set_alias(self, name: str, alias: str, version: int) -> None:
        """Point `alias` at a ready version; for `stable` this ends tracking of the newest version."""
        check_name(name)
        check_alias(alias)
        check_version(version)
        with self.writing() as db:
            exists = db.execute("SELECT 1 FROM versions WHERE name = ? AND version = ? AND state = 'ready'",
                                (name, version)).fetchone()
            if exists is None:
                raise VersionNotFound(f"{version_label(name, version)} does not exist")
            current = db.execute("SELECT version FROM aliases WHERE name = ? AND alias = ?",
                                 (name, alias)).fetchone()
            if current is not None and current[0] == version:
                db.execute("UPDATE aliases SET explicit = 1 WHERE name = ? AND alias = ?", (name, alias))
            else:
                self._move_alias(db, name, alias, version, explicit=True)
            if alias == STABLE:
                self._end_rollout(db, name, "promoted", f"stable promoted to {version_label(name, version)}")

    def alias_target(self, name: str, alias: str) -> int | None:
        with self.reading() as db:
            row = db.execute("SELECT version FROM aliases WHERE name = ? AND alias = ?", (name, alias)).fetchone()
        return row[0] if row else None

    def aliases(self, name: str) -> dict[str, int]:
        with self.reading() as db:
            rows = db.execute("SELECT alias, version FROM aliases WHERE name = ? ORDER BY alias", (name,)).fetchall()
        return dict(rows)

    def previous_target(self, name: str, alias: str = STABLE) -> int | None:
        """Where `rollback` would move `alias` now (None: nowhere); moves nothing."""
        with self.reading() as db:
            current = db.execute("SELECT version FROM aliases WHERE name = ? AND alias = ?",
                                 (name, alias)).fetchone()
            if current is None:
                return None
            history = db.execute("SELECT version FROM alias_history WHERE name = ? AND alias = ? ORDER BY id DESC",
                                 (name, alias)).fetchall()
        return next((version for (version,) in history if version != current[0]), None)

    def is_explicit(self, name: str, alias: str) -> bool:
        with self.reading() as db:
            row = db.execute("SELECT explicit FROM aliases WHERE name = ? AND alias = ?", (name, alias)).fetchone()
        return bool(row and row[0])

    def rollback(self, name: str, alias: str = STABLE) -> int:
        """Move `alias` back to its previous target and return it; the alias becomes explicit."""
        with self.writing() as db:
            current = db.execute("SELECT version FROM aliases WHERE name = ? AND alias = ?",
                                 (name, alias)).fetchone()
            if current is None:
                raise VersionNotFound(f"{name} has no alias {alias!r}")
            # Newest first; the first entry that differs from the current target is where to go back to.
            history = db.execute("SELECT id, version FROM alias_history WHERE name = ? AND alias = ? "
                                 "ORDER BY id DESC", (name, alias)).fetchall()
            previous = next(((row_id, version) for row_id, version in history if version != current[0]), None)
            if previous is None:
                raise NothingToRollBack(f"alias {alias!r} of {name} has no earlier target to roll back to")
            row_id, version = previous
            db.execute("DELETE FROM alias_history WHERE name = ? AND alias = ? AND id > ?", (name, alias, row_id))
            db.execute("UPDATE aliases SET version = ?, explicit = 1 WHERE name = ? AND alias = ?",
                       (version, name, alias))
            if alias == STABLE:
                self._end_rollout(db, name, "aborted", f"stable rolled back to {version_label(name, version)}")
        return version

    @staticmethod
    def _end_rollout(db: Database, name: str, state: str, reason: str) -> None:
        """An explicit move of `stable` ends the name's active rollout (adapters/rollouts.py), in its transaction."""
        row = db.execute("SELECT id FROM rollouts WHERE name = ? AND state = 'active'", (name,)).fetchone()
        if row is None:
            return
        now = utc_now()
        db.execute("UPDATE rollouts SET state = ?, reason = ?, ended_at = ? WHERE id = ?", (state, reason, now, row[0]))
        db.execute("INSERT INTO rollout_events (rollout_id, kind, detail, at) VALUES (?, ?, ?, ?)",
                   (row[0], state, reason, now))

    @staticmethod
    def _move_alias(db: Database, name: str, alias: str, version: int, explicit: bool) -> None:
        db.execute("INSERT INTO aliases (name, alias, version, explicit) VALUES (?, ?, ?, ?) "
                   "ON CONFLICT (name, alias) DO UPDATE SET version = excluded.version, explicit = excluded.explicit",
                   (name, alias, version, int(explicit)))
        db.execute("INSERT INTO alias_history (name, alias, version, at) VALUES (?, ?, ?, ?)",
                   (name, alias, version, utc_now()))
