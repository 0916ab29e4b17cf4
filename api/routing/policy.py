"""Pure decisions of a rollout: which arm serves a request, and whether a shadow copy runs.

Assignment hashes (rollout id, key) with SHA-256 into a bucket 0..9999; the candidate takes buckets below
percent x 100. The key is the request's `user` (else its tenant) for a sticky rollout, so a user keeps its arm
across requests and restarts, and the request id otherwise (a retry with the same X-Request-Id lands alike).
A new rollout (new id) reshuffles users.
"""

from __future__ import annotations

import hashlib

from adapters.rollouts import CANDIDATE_ARM, STABLE_ARM, Rollout

BUCKETS = 10_000


def bucket(rollout_id: int, key: str, salt: str = "") -> int:
    digest = hashlib.sha256(f"{rollout_id}\0{salt}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def in_share(percent: float, rollout_id: int, key: str, salt: str = "") -> bool:
    return bucket(rollout_id, key, salt) < round(percent * BUCKETS / 100)


def assignment_key(rollout: Rollout, user: str | None, tenant: str, request_id: str) -> str:
    if rollout.sticky:
        return f"user:{user}" if user else f"tenant:{tenant}"
    return f"request:{request_id}"


def arm_of(rollout: Rollout, user: str | None, tenant: str, request_id: str) -> str:
    key = assignment_key(rollout, user, tenant, request_id)
    return CANDIDATE_ARM if in_share(rollout.percent, rollout.id, key) else STABLE_ARM


def shadows(rollout: Rollout, arm: str, request_id: str) -> bool:
    """A copy of a stable-arm request runs on the candidate for `shadow_percent` of them (by request id)."""
    return arm == STABLE_ARM and in_share(rollout.shadow_percent, rollout.id, request_id, salt="shadow")
