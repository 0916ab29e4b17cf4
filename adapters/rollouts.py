"""Rollouts in the registry index: a candidate version taking a share of a name's traffic, their events, the
outcome of every request they routed, shadow comparisons, and each name's fallback chain.

One rollout per name is active at a time (a partial unique index). Its state survives restarts because it
lives in the same database as versions and aliases (the index's SQLite file or PostgreSQL database, adapters/sql.py);
`promote`, `abort` and the automatic rollback end it.
Only ready versions can be a rollout's stable or candidate arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.identity import check_name, check_version, version_label
from adapters.index import RegistryError, RegistryIndex, VersionNotFound
from adapters.manifest import utc_now

RolloutState = Literal["active", "promoted", "aborted", "rolled_back"]
STABLE_ARM = "stable"
CANDIDATE_ARM = "candidate"


class RolloutExists(RegistryError):
    """The name already has an active rollout."""


class NoActiveRollout(RegistryError):
    """The name has no active rollout to end."""


class RolloutGuard(BaseModel):
    """When the candidate is rolled back by itself: over the last `window_s`, once it has `min_requests`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_error_rate: float = Field(default=0.2, ge=0, le=1, description="Largest share of candidate requests "
                                  "ending in a server error (5xx) before it is rolled back.")
    max_ttft_p95_s: float | None = Field(default=None, gt=0, description="Largest candidate TTFT p95 in "
                                         "seconds before it is rolled back (default: not checked).")
    window_s: float = Field(default=300.0, gt=0, description="The sliding window the guard judges, seconds.")
    min_requests: int = Field(default=20, ge=1, description="Candidate requests in the window before the "
                              "guard judges at all.")


@dataclass(frozen=True)
class Rollout:
    id: int
    name: str
    stable_version: int
    candidate_version: int
    percent: float  # 0..100 of the name's traffic sent to the candidate
    sticky: bool  # by a hash of user (else tenant), not per request
    shadow_percent: float  # 0..100 of the stable arm's requests copied to the candidate
    guard: RolloutGuard
    state: RolloutState
    reason: str
    started_at: str
    ended_at: str | None

    @property
    def stable_label(self) -> str:
        return version_label(self.name, self.stable_version)

    @property
    def candidate_label(self) -> str:
        return version_label(self.name, self.candidate_version)


@dataclass(frozen=True)
class RolloutEvent:
    rollout_id: int
    kind: str  # started, promoted, aborted, rolled_back
    detail: str
    at: str


@dataclass(frozen=True)
class ArmOutcome:
    """One request a rollout routed, as its report reads it."""

    request_id: str
    rollout_id: int
    arm: str
    tenant: str
    status: int
    ttft_s: float | None
    tpot_s: float | None
    completion_tokens: int
    cost_usd: float
    logprob: float | None  # mean logprob of the output tokens, when the request asked for logprobs
    at: float
    feedback: float | None = None


@dataclass(frozen=True)
class ShadowResult:
    rollout_id: int
    request_id: str
    status: int
    exact: bool
    overlap: float
    completion_tokens: int
    cost_usd: float
    at: float


@dataclass(frozen=True)
class FallbackChain:
    """What serves a bare NAME when its version cannot: the previous stable version, then the base model."""

    previous: bool = False
    base: bool = False


_ROLLOUT_COLUMNS = ("id, name, stable_version, candidate_version, percent, sticky, shadow_percent, guard_json, "
                    "state, reason, started_at, ended_at")


def _rollout(row: tuple) -> Rollout:
    return Rollout(id=row[0], name=row[1], stable_version=row[2], candidate_version=row[3], percent=row[4],
                   sticky=bool(row[5]), shadow_percent=row[6], guard=RolloutGuard.model_validate_json(row[7]),
                   state=row[8], reason=row[9], started_at=row[10], ended_at=row[11])


def _check_percent(value: float, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 100:
        raise ValueError(f"{what} must be a number in [0, 100], got {value!r}")
    return float(value)


class RolloutStore:
    """Rollout tables of a `RegistryIndex`; every call is one transaction, so the CLI and servers share them."""

    def __init__(self, index: RegistryIndex):
        self.index = index

    def start(self, name: str, candidate_version: int, percent: float, sticky: bool = False,
              shadow_percent: float = 0.0, guard: RolloutGuard | None = None) -> Rollout:
        """Starts a rollout of `name`: its current `stable` against `candidate_version` (both ready)."""
        check_name(name)
        check_version(candidate_version)
        _check_percent(percent, "percent")
        _check_percent(shadow_percent, "shadow percent")
        guard = guard or RolloutGuard()
        with self.index.writing() as db:
            stable = db.execute("SELECT version FROM aliases WHERE name = ? AND alias = 'stable'", (name,)).fetchone()
            if stable is None:
                raise VersionNotFound(f"adapter {name!r} has no stable version to roll out against")
            ready = db.execute("SELECT 1 FROM versions WHERE name = ? AND version = ? AND state = 'ready'",
                               (name, candidate_version)).fetchone()
            if ready is None:
                raise VersionNotFound(f"{version_label(name, candidate_version)} does not exist")
            if stable[0] == candidate_version:
                raise RegistryError(f"{version_label(name, candidate_version)} is already stable")
            if db.execute("SELECT 1 FROM rollouts WHERE name = ? AND state = 'active'", (name,)).fetchone():
                raise RolloutExists(f"{name} already has an active rollout; promote or abort it first")
            cursor = db.execute(
                "INSERT INTO rollouts (name, stable_version, candidate_version, percent, sticky, shadow_percent, "
                "guard_json, state, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'active', ?) RETURNING id",
                (name, stable[0], candidate_version, float(percent), int(sticky), float(shadow_percent),
                 guard.model_dump_json(), utc_now()))
            rollout_id = cursor.fetchone()[0]
            self._event(db, rollout_id, "started", f"{percent:g}% to {version_label(name, candidate_version)}"
                        f"{' (sticky)' if sticky else ''}, shadow {shadow_percent:g}%")
            row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return _rollout(row)

    def active(self) -> dict[str, Rollout]:
        """Active rollouts by name."""
        with self.index.reading() as db:
            rows = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE state = 'active'").fetchall()
        return {row[1]: _rollout(row) for row in rows}

    def get(self, rollout_id: int) -> Rollout:
        with self.index.reading() as db:
            row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise VersionNotFound(f"no rollout {rollout_id}")
        return _rollout(row)

    def latest(self, name: str) -> Rollout:
        """The name's active rollout, else its most recent one."""
        with self.index.reading() as db:
            row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE name = ? "
                             "ORDER BY (state = 'active') DESC, id DESC LIMIT 1", (name,)).fetchone()
        if row is None:
            raise VersionNotFound(f"adapter {name!r} has no rollout")
        return _rollout(row)

    def history(self, limit: int = 50) -> list[Rollout]:
        with self.index.reading() as db:
            rows = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [_rollout(row) for row in rows]

    def end(self, name: str, state: RolloutState, reason: str, rollout_id: int | None = None) -> Rollout:
        """Ends the active rollout of `name` as aborted or rolled_back (only if it is `rollout_id`, when given);
        traffic returns to its stable version."""
        if state not in ("aborted", "rolled_back"):
            raise ValueError("a rollout ends as aborted or rolled_back here; promote() ends it as promoted")
        with self.index.writing() as db:
            rollout = self._active(db, name, rollout_id)
            db.execute("UPDATE rollouts SET state = ?, reason = ?, ended_at = ? WHERE id = ?",
                       (state, reason, utc_now(), rollout.id))
            self._event(db, rollout.id, state, reason)
            row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout.id,)).fetchone()
        return _rollout(row)

    def promote(self, name: str) -> Rollout:
        """Makes the active rollout's candidate `stable` and ends the rollout as promoted, in one transaction."""
        with self.index.writing() as db:
            rollout = self._active(db, name, None)
            RegistryIndex._move_alias(db, name, "stable", rollout.candidate_version, explicit=True)
            RegistryIndex._end_rollout(db, name, "promoted", f"stable promoted to {rollout.candidate_label}")
            row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout.id,)).fetchone()
        return _rollout(row)

    @staticmethod
    def _active(db, name: str, rollout_id: int | None) -> Rollout:
        row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE name = ? AND state = 'active'",
                         (name,)).fetchone()
        if row is None or (rollout_id is not None and row[0] != rollout_id):
            raise NoActiveRollout(f"{name} has no active rollout")
        return _rollout(row)

    @staticmethod
    def _event(db, rollout_id: int, kind: str, detail: str) -> None:
        db.execute("INSERT INTO rollout_events (rollout_id, kind, detail, at) VALUES (?, ?, ?, ?)",
                   (rollout_id, kind, detail, utc_now()))

    def events(self, rollout_id: int | None = None, limit: int = 100) -> list[RolloutEvent]:
        with self.index.reading() as db:
            if rollout_id is None:
                rows = db.execute("SELECT rollout_id, kind, detail, at FROM rollout_events ORDER BY id DESC LIMIT ?",
                                  (limit,)).fetchall()
            else:
                rows = db.execute("SELECT rollout_id, kind, detail, at FROM rollout_events WHERE rollout_id = ? "
                                  "ORDER BY id DESC LIMIT ?", (rollout_id, limit)).fetchall()
        return [RolloutEvent(*row) for row in rows]

    # Outcomes

    def record(self, outcomes: list[ArmOutcome]) -> None:
        with self.index.writing() as db:
            for o in outcomes:
                db.execute(
                    "INSERT INTO rollout_requests (request_id, rollout_id, arm, tenant, status, ttft_s, tpot_s, "
                    "completion_tokens, cost_usd, logprob, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (request_id) DO NOTHING",
                    (o.request_id, o.rollout_id, o.arm, o.tenant, o.status, o.ttft_s, o.tpot_s, o.completion_tokens,
                     o.cost_usd, o.logprob, o.at))

    def feedback(self, request_id: str, tenant: str, score: float) -> bool:
        """Records a score for a routed request of `tenant`; False when there is no such request."""
        with self.index.writing() as db:
            return db.execute("UPDATE rollout_requests SET feedback = ? WHERE request_id = ? AND tenant = ?",
                              (score, request_id, tenant)).rowcount == 1

    def outcomes(self, rollout_id: int) -> list[ArmOutcome]:
        with self.index.reading() as db:
            rows = db.execute("SELECT request_id, rollout_id, arm, tenant, status, ttft_s, tpot_s, completion_tokens, "
                              "cost_usd, logprob, at, feedback FROM rollout_requests WHERE rollout_id = ?",
                              (rollout_id,)).fetchall()
        return [ArmOutcome(*row) for row in rows]

    def record_shadow(self, result: ShadowResult) -> None:
        with self.index.writing() as db:
            db.execute("INSERT INTO shadow_results (rollout_id, request_id, status, exact, overlap, completion_tokens, "
                       "cost_usd, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (result.rollout_id, result.request_id, result.status, int(result.exact), result.overlap,
                        result.completion_tokens, result.cost_usd, result.at))

    def shadows(self, rollout_id: int) -> list[ShadowResult]:
        with self.index.reading() as db:
            rows = db.execute("SELECT rollout_id, request_id, status, exact, overlap, completion_tokens, cost_usd, at "
                              "FROM shadow_results WHERE rollout_id = ?", (rollout_id,)).fetchall()
        return [ShadowResult(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6], r[7]) for r in rows]

    # Fallback chains

    def set_fallback(self, name: str, chain: FallbackChain) -> None:
        check_name(name)
        with self.index.writing() as db:
            db.execute("INSERT INTO fallbacks (name, previous, base) VALUES (?, ?, ?) ON CONFLICT (name) "
                       "DO UPDATE SET previous = excluded.previous, base = excluded.base",
                       (name, int(chain.previous), int(chain.base)))

    def fallbacks(self) -> dict[str, FallbackChain]:
        with self.index.reading() as db:
            rows = db.execute("SELECT name, previous, base FROM fallbacks").fetchall()
        return {name: FallbackChain(bool(previous), bool(base)) for name, previous, base in rows}
