from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from adapters.index import (
    LOCK_KEY,
    MIGRATIONS,
    SCHEMA_VERSION,
    VERSION_TABLE,
    RegistryError,
    RegistryIndex,
    VersionNotFound,
)
from adapters.rollouts import (
    ArmOutcome,
    FallbackChain,
    NoActiveRollout,
    RolloutExists,
    RolloutGuard,
    RolloutStore,
    ShadowResult,
)
from adapters.sql import migrate, open_database
from tests.adapters.test_index import push


@pytest.fixture
def index(database_url):
    with RegistryIndex(database_url) as idx:
        push(idx, "a", "v1", "v2", "v3")
        idx.set_alias("a", "stable", 1)
        yield idx


@pytest.fixture
def store(index):
    return RolloutStore(index)


def test_start_reads_stable_and_survives_reopening(index, store, database_url):
    guard = RolloutGuard(max_error_rate=0.1, min_requests=5, window_s=60)
    started = store.start("a", 2, 10, sticky=True, shadow_percent=25, guard=guard)
    assert (started.stable_version, started.candidate_version, started.percent, started.sticky,
            started.shadow_percent, started.guard, started.state) == (1, 2, 10.0, True, 25.0, guard, "active")
    index.close()
    with RegistryIndex(database_url) as reopened:
        assert RolloutStore(reopened).active() == {"a": started}


@pytest.mark.parametrize(("name", "candidate", "error"), [
    ("a", 9, VersionNotFound),  # no such version
    ("a", 1, RegistryError),  # already stable
    ("b", 1, VersionNotFound),  # no such name
])
def test_start_refuses(store, name, candidate, error):
    with pytest.raises(error):
        store.start(name, candidate, 10)


@pytest.mark.parametrize(("percent", "shadow"), [(-1, 0), (101, 0), (10, 100.5)])
def test_start_refuses_bad_percentages(store, percent, shadow):
    with pytest.raises(ValueError):
        store.start("a", 2, percent, shadow_percent=shadow)


def test_one_active_rollout_per_name(store):
    store.start("a", 2, 10)
    with pytest.raises(RolloutExists):
        store.start("a", 3, 10)


def test_promote_moves_stable_and_ends_the_rollout(index, store):
    started = store.start("a", 2, 10)
    ended = store.promote("a")
    assert ended.state == "promoted" and ended.id == started.id
    assert index.alias_target("a", "stable") == 2 and index.is_explicit("a", "stable")
    assert store.active() == {}
    assert [e.kind for e in store.events(started.id)] == ["promoted", "started"]


@pytest.mark.parametrize("state", ["aborted", "rolled_back"])
def test_abort_and_rollback_leave_stable(index, store, state):
    store.start("a", 2, 10)
    ended = store.end("a", state, "why")
    assert (ended.state, ended.reason) == (state, "why")
    assert index.alias_target("a", "stable") == 1
    with pytest.raises(NoActiveRollout):
        store.end("a", state, "again")


def test_ending_another_rollout_id_is_refused(store):
    started = store.start("a", 2, 10)
    with pytest.raises(NoActiveRollout):
        store.end("a", "rolled_back", "stale guard", rollout_id=started.id + 1)
    assert store.active()["a"].id == started.id


@pytest.mark.parametrize(("move", "state"), [
    (lambda index: index.set_alias("a", "stable", 3), "promoted"),
    (lambda index: index.rollback("a"), "aborted"),
])
def test_moving_stable_by_hand_ends_the_rollout(index, store, move, state):
    index.set_alias("a", "stable", 3)
    index.set_alias("a", "stable", 1)
    store.start("a", 2, 10)
    move(index)
    assert store.active() == {}
    assert store.latest("a").state == state


def test_outcomes_feedback_and_shadows(store):
    rollout = store.start("a", 2, 50)
    store.record([ArmOutcome("r1", rollout.id, "stable", "acme", 200, 0.1, 0.01, 5, 0.001, -0.5, 1.0),
                  ArmOutcome("r2", rollout.id, "candidate", "acme", 500, None, None, 0, 0.0, None, 2.0)])
    assert store.feedback("r1", "acme", 1.0)
    assert not store.feedback("r1", "globex", 1.0)  # another tenant's request
    assert not store.feedback("nope", "acme", 1.0)
    rows = {o.request_id: o for o in store.outcomes(rollout.id)}
    assert rows["r1"].feedback == 1.0 and rows["r2"].feedback is None and rows["r2"].status == 500
    store.record_shadow(ShadowResult(rollout.id, "r1", 200, True, 1.0, 5, 0.002, 1.0))
    assert store.shadows(rollout.id) == [ShadowResult(rollout.id, "r1", 200, True, 1.0, 5, 0.002, 1.0)]


def test_fallback_chains(store):
    assert store.fallbacks() == {}
    store.set_fallback("a", FallbackChain(previous=True, base=False))
    store.set_fallback("a", FallbackChain(previous=True, base=True))
    assert store.fallbacks() == {"a": FallbackChain(previous=True, base=True)}


def test_previous_target_moves_nothing(index):
    index.set_alias("a", "stable", 3)
    assert index.previous_target("a") == 1
    assert index.alias_target("a", "stable") == 3
    assert index.previous_target("b") is None


def test_a_schema_1_index_is_upgraded(tmp_path):
    path = tmp_path / "old.sqlite"
    with closing(open_database(path)) as db:  # as loraplex wrote it before rollouts: migration 1 only
        migrate(db, LOCK_KEY, VERSION_TABLE, MIGRATIONS[:1])
    with RegistryIndex(path) as index:
        push(index, "a", "v1", "v2")
        assert RolloutStore(index).start("a", 1 if index.alias_target("a", "stable") == 2 else 2, 5).state == "active"
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 2
