"""The routing step against a real registry index, with a loader that fails on demand (no engine)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from adapters.identity import parse_model_ref
from adapters.index import RegistryIndex
from adapters.rollouts import FallbackChain, RolloutGuard, RolloutStore
from api.errors import OpenAIError
from api.generation.accounting import OutcomeSink, RequestAccount
from api.generation.adapter_loading import AdapterLoadFailed
from api.generation.resolve import Resolved, ServedModel, everything
from api.routing.config import RoutingConfig
from api.routing.landing import FALLBACK_HEADER, FallbackLoader
from api.routing.metrics import RoutingMetrics
from api.routing.traffic import ROUTE_HEADER, Traffic
from api.tenancy.config import BATCH_PRIORITY
from tests.adapters.test_index import push

BASE = "base-model"


class Registry:
    def __init__(self, index):
        self.index = index


class Loader:
    """Fails for the labels in `failing`; records what it was asked to load."""

    def __init__(self):
        self.failing: set[str] = set()
        self.asked: list[str] = []

    async def enter(self, served: ServedModel, account):
        self.asked.append(served.id)
        if served.id in self.failing:
            raise AdapterLoadFailed(served.id, "the store is down", invalid=False)
        return None


@pytest.fixture
def index(tmp_path):
    with RegistryIndex(tmp_path / "index.sqlite") as idx:
        push(idx, "a", "v1", "v2", "v3")
        idx.set_alias("a", "stable", 2)
        yield idx


@pytest.fixture
def store(index):
    return RolloutStore(index)


@pytest.fixture
def traffic(index, store):
    metrics = RoutingMetrics(CollectorRegistry(), lambda label: label)
    return Traffic(Registry(index), store, RoutingConfig(breaker_failures=2, rollout_refresh_s=0), metrics)


def served(index, version: int | None) -> ServedModel:
    return ServedModel(BASE, None if version is None else index.get("a", version))


def resolved(index, model: str, version: int | None) -> Resolved:
    """`model` as a request names it, resolved to version `version` of adapter a (None: the base model)."""
    return Resolved(None if model == BASE else parse_model_ref(model), served(index, version))


async def load(traffic, loader, route, request_id: str):
    """The load step as the pipeline runs it: the landing, reported to the traffic."""
    landing = await FallbackLoader(loader, traffic.breakers, traffic.metrics, 60.0).load(route, account(request_id))
    traffic.landed(request_id, landing.served, landing.primary_failed)
    return landing


def account(request_id: str) -> RequestAccount:
    return RequestAccount(OutcomeSink([]), request_id)


def outcome(account_: RequestAccount, status: int):
    account_.model = "a"
    return account_.finish(status)


@pytest.mark.parametrize(("model", "version", "policy"), [("a@2", 2, "pinned"), ("a:stable", 2, "pinned"),
                                                         (BASE, None, "direct"), ("a", 2, "direct")])
def test_without_a_rollout(index, traffic, model, version, policy):
    route = traffic.decide(resolved(index, model, version), "acme", None, "r1", everything)
    assert route.policy == policy and route.primary.id == served(index, version).id and route.chain == ()


def test_a_full_canary_serves_the_candidate_and_falls_back_to_stable(index, store, traffic):
    rollout = store.start("a", 3, 100)
    route = traffic.decide(resolved(index, "a", 2), "acme", None, "r1", everything)
    assert (route.policy, route.arm, route.primary.id, [s.id for s in route.chain]) == ("canary", "candidate", "a@3",
                                                                                         ["a@2"])
    assert route.header() == f"canary;arm=candidate;rollout={rollout.id}"
    pinned = traffic.decide(resolved(index, "a@3", 3), "acme", None, "r2", everything)
    assert pinned.policy == "pinned" and pinned.rollout is None


def test_sticky_zero_percent_with_a_full_shadow(index, store, traffic):
    store.start("a", 3, 0, sticky=True, shadow_percent=100)
    route = traffic.decide(resolved(index, "a", 2), "acme", "alice", "r1", everything)
    assert (route.policy, route.arm, route.primary.id, route.shadow.id) == ("ab", "stable", "a@2", "a@3")


async def test_a_failing_candidate_falls_back_then_its_breaker_opens(index, store, traffic):
    store.start("a", 3, 100)
    loader = Loader()
    loader.failing = {"a@3"}
    for i in range(3):
        route = traffic.decide(resolved(index, "a", 2), "acme", None, f"r{i}", everything)
        landing = await load(traffic, loader, route, f"r{i}")
        assert landing.served.id == "a@2"
        reason = "load_failed" if i < 2 else "breaker_open"
        assert landing.headers() == {ROUTE_HEADER: route.header(),
                                     FALLBACK_HEADER: f"a@3;reason={reason};served=a@2"}
        assert landing.ledger_route().endswith(f"fallback_from=a@3;reason={reason}")
    assert loader.asked == ["a@3", "a@2", "a@3", "a@2", "a@2"]  # the open breaker spared the third load
    assert traffic.breakers.of("a@3").state.name == "OPEN"


async def test_no_fallback_configured_means_503(index, traffic):
    loader = Loader()
    loader.failing = {"a@2"}
    route = traffic.decide(resolved(index, "a", 2), "acme", None, "r1", everything)
    with pytest.raises(OpenAIError) as e:
        await load(traffic, loader, route, "r1")
    assert e.value.status == 503
    await asyncio.sleep(0)


@pytest.mark.parametrize(("chain", "may_use_base", "expected"), [
    (FallbackChain(previous=True), True, ["a@1"]),
    (FallbackChain(base=True), True, [BASE]),
    (FallbackChain(previous=True, base=True), True, ["a@1", BASE]),
    (FallbackChain(previous=True, base=True), False, ["a@1"]),  # a tenant without the base model
])
async def test_configured_chains(index, store, traffic, chain, may_use_base, expected):
    store.set_fallback("a", chain)
    index.set_alias("a", "stable", 1)
    index.set_alias("a", "stable", 2)
    route = traffic.decide(resolved(index, "a", 2), "acme", None, "r1", lambda name: name is not None or may_use_base)
    assert [s.id for s in route.chain] == expected
    loader = Loader()
    loader.failing = {"a@2", "a@1"}
    if expected[-1] == BASE:
        assert (await load(traffic, loader, route, "r1")).served.id == BASE


def test_candidate_errors_roll_the_rollout_back(index, store, traffic):
    store.start("a", 3, 100, guard=RolloutGuard(max_error_rate=0.5, min_requests=4))
    for i in range(4):
        route = traffic.decide(resolved(index, "a", 2), "acme", None, f"r{i}", everything)
        acc = account(f"r{i}")
        traffic.landed(f"r{i}", route.primary, None)
        traffic.observe(outcome(acc, 500 if i % 2 == 0 or i == 3 else 200))
    assert store.active() == {}
    ended = store.latest("a")
    assert ended.state == "rolled_back" and "error rate 75%" in ended.reason
    assert [o.arm for o in store.outcomes(ended.id)] == ["candidate"] * 4
    route = traffic.decide(resolved(index, "a", 2), "acme", None, "after", everything)
    assert route.policy == "direct" and route.primary.id == "a@2"


def test_a_candidate_that_fell_back_counts_as_its_error(index, store, traffic):
    rollout = store.start("a", 3, 100)
    route = traffic.decide(resolved(index, "a", 2), "acme", None, "r1", everything)
    traffic.landed("r1", route.chain[0], 503)  # the candidate's load failed; the chain's stable version served
    traffic.observe(outcome(account("r1"), 200))
    [row] = store.outcomes(rollout.id)
    assert (row.arm, row.status) == ("candidate", 503)


def test_routes_are_forgotten_once_observed(index, traffic):
    traffic.decide(resolved(index, "a", 2), "acme", None, "r1", everything)
    traffic.observe(outcome(account("r1"), 200))
    assert traffic._routes == {}
    traffic.observe(replace(outcome(account("r1"), 200), request_id="unknown"))  # never routed: ignored


async def test_a_probe_cancelled_while_loading_lets_the_next_request_probe(index, store):
    metrics = RoutingMetrics(CollectorRegistry(), lambda label: label)
    traffic = Traffic(Registry(index), store, RoutingConfig(breaker_failures=1, breaker_open_s=0,
                                                                 rollout_refresh_s=0), metrics)
    traffic.breakers.of("a@2").failure()  # open, and at once half-open (open_s 0)
    entered, stuck = asyncio.Event(), asyncio.Event()

    class Hanging(Loader):
        async def enter(self, served, account):
            self.asked.append(served.id)
            entered.set()
            await stuck.wait()

    loader = Hanging()
    route = traffic.decide(resolved(index, "a", 2), "acme", None, "r1", everything)
    task = asyncio.create_task(load(traffic, loader, route, "r1"))
    await entered.wait()
    assert loader.asked == ["a@2"] and not traffic.breakers.of("a@2").allow()  # the probe is out
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert traffic.breakers.of("a@2").allow()


def test_batch_lines_feed_breakers_only_and_keyed_work_is_forgotten_too(index, store, traffic):
    rollout = store.start("a", 3, 100)
    traffic.decide(resolved(index, "a", 2), "acme", None, "line#1", everything)
    line = account("line#1")
    line.priority, line.billing_key = BATCH_PRIORITY, "batch_1:7"  # as api/generation/request.py marks a line
    traffic.decide(resolved(index, "a", 2), "acme", None, "job#1", everything)
    job = account("job#1")
    job.billing_key = "job_1"
    traffic.observe(outcome(line, 200))
    traffic.observe(outcome(job, 200))
    assert traffic._routes == {}
    assert [o.request_id for o in store.outcomes(rollout.id)] == ["job_1"]  # the live-priced job, not the line
