import pytest

from adapters.rollouts import CANDIDATE_ARM, STABLE_ARM, Rollout, RolloutGuard
from api.routing.policy import BUCKETS, arm_of, assignment_key, bucket, in_share, shadows


def rollout(percent: float = 10, sticky: bool = False, shadow: float = 0, rollout_id: int = 1) -> Rollout:
    return Rollout(id=rollout_id, name="a", stable_version=1, candidate_version=2, percent=percent, sticky=sticky,
                   shadow_percent=shadow, guard=RolloutGuard(), state="active", reason="", started_at="", ended_at=None)


def test_bucket_is_a_stable_hash():
    # sha256("1\0\0user:alice") read big-endian from its first 8 bytes, mod 10000: fixed forever, so an
    # assignment survives restarts and is the same on every replica.
    assert bucket(1, "user:alice") == bucket(1, "user:alice")
    assert 0 <= bucket(1, "user:alice") < BUCKETS
    assert bucket(1, "user:alice") != bucket(2, "user:alice") or bucket(1, "user:bob") != bucket(2, "user:bob")


@pytest.mark.parametrize("percent", [0, 1, 10, 50, 99.5, 100])
def test_share_of_keys_matches_percent(percent):
    hits = sum(in_share(percent, 7, f"k{i}") for i in range(20_000))
    assert abs(hits / 20_000 * 100 - percent) < 1.0
    if percent in (0, 100):
        assert hits == percent * 200


@pytest.mark.parametrize(("sticky", "user", "tenant", "request_id", "key"), [
    (True, "alice", "acme", "r1", "user:alice"),
    (True, None, "acme", "r1", "tenant:acme"),
    (True, "", "acme", "r1", "tenant:acme"),
    (False, "alice", "acme", "r1", "request:r1"),
])
def test_assignment_key(sticky, user, tenant, request_id, key):
    assert assignment_key(rollout(sticky=sticky), user, tenant, request_id) == key


def test_sticky_users_keep_their_arm_whatever_the_request():
    r = rollout(percent=50, sticky=True)
    for user in (f"user-{i}" for i in range(200)):
        arms = {arm_of(r, user, "acme", f"req-{j}") for j in range(5)}
        assert len(arms) == 1


def test_per_request_assignment_varies_by_request():
    r = rollout(percent=50)
    assert {arm_of(r, "alice", "acme", f"req-{j}") for j in range(50)} == {STABLE_ARM, CANDIDATE_ARM}


@pytest.mark.parametrize(("shadow", "arm", "expected"), [
    (100, STABLE_ARM, True), (0, STABLE_ARM, False), (100, CANDIDATE_ARM, False)])
def test_shadows_only_the_stable_arm(shadow, arm, expected):
    assert shadows(rollout(shadow=shadow), arm, "req-1") is expected
