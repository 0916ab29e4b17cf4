"""The routing step: which adapter version serves a request, and what serves it when that version cannot.

Between resolving `model` and admitting the request, `decide` applies the name's active rollout (only to a bare
NAME; `NAME@V` and `NAME:ALIAS` pin) and builds the fallback chain, a frozen `Route`; after admission the load
step (`api.routing.landing`) brings the first option that can serve into the engine and reports its `Landing`
here. Every finished request comes back through `observe`, which feeds the breakers, records the arm's outcome
and rolls the rollout back when its guard is breached.

Active rollouts and fallback chains are read from the registry index at most every `rollout_refresh_s`, so the
per-request cost is a dictionary lookup and two hashes; a change made by the CLI or another server is seen
within that interval.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from adapters.index import VersionNotFound
from adapters.manifest import Manifest
from adapters.registry import Registry
from adapters.rollouts import CANDIDATE_ARM, ArmOutcome, FallbackChain, Rollout, RolloutStore
from api.generation.resolve import Resolved, ServedModel, Visibility
from api.observability.outcome import RequestOutcome
from api.routing.breaker import Breakers
from api.routing.config import RoutingConfig
from api.routing.guard import GuardWindow
from api.routing.metrics import RoutingMetrics
from api.routing.policy import arm_of, shadows
from api.tenancy.config import BATCH_PRIORITY
from engine.types import ChoiceDelta

logger = logging.getLogger(__name__)

ROUTE_HEADER = "x-loraplex-route"


@dataclass
class PrimaryTap:
    """The primary's output as it streams (`Traffic.tap`), for its shadow's comparison and the A/B readout's
    mean log-probability."""

    output: dict[int, list[int]] = field(default_factory=dict)  # choice -> token ids
    logprob_sum: float = 0.0
    logprob_count: int = 0
    finished: asyncio.Future | None = None  # set by a started shadow; resolves with `output` at the primary's end


@dataclass(frozen=True)
class Route:
    """What the routing step decided for one request."""

    policy: str  # canary, ab (a sticky rollout), direct (a bare NAME or the base model), pinned
    primary: ServedModel
    chain: tuple[ServedModel, ...] = ()  # what serves, in order, when the one before cannot
    rollout: Rollout | None = None
    arm: str | None = None
    shadow: ServedModel | None = None  # the candidate, when this request is copied to it
    tap: PrimaryTap = field(default_factory=PrimaryTap, compare=False)

    def header(self) -> str:
        parts = [self.policy]
        if self.arm is not None:
            parts.append(f"arm={self.arm}")
        if self.rollout is not None:
            parts.append(f"rollout={self.rollout.id}")
        return ";".join(parts)


@dataclass
class _Tracked:
    route: Route
    served: ServedModel | None = None  # what the load step brought in (`landed`)
    primary_failed: int | None = None


@dataclass(frozen=True)
class _Snapshot:
    at: float
    rollouts: dict[str, Rollout]
    fallbacks: dict[str, FallbackChain]
    previous: dict[str, int]  # name -> the version `stable` would roll back to, for names whose chain has it


class Traffic:
    def __init__(self, registry: Registry, store: RolloutStore, config: RoutingConfig, metrics: RoutingMetrics,
                 clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.store = store
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self.breakers = Breakers(config.breaker_failures, config.breaker_open_s, clock)
        metrics.set_breaker_source(self.breakers.states)
        self._snapshot: _Snapshot | None = None
        self._manifests: dict[tuple[str, int], Manifest] = {}
        self._routes: dict[str, Route] = {}  # request id -> route, until the request's outcome is observed
        self._windows: dict[int, GuardWindow] = {}
        self._lock = threading.Lock()  # `observe` runs in the accounts' worker thread

    # Decide

    def refresh(self) -> _Snapshot:
        """Re-reads rollouts and fallback chains (at most every `rollout_refresh_s` unless forced by a change)."""
        now = self._clock()
        snap = self._snapshot
        if snap is not None and now - snap.at < self.config.rollout_refresh_s:
            return snap
        fallbacks = self.store.fallbacks()
        previous = {}
        for name, chain in fallbacks.items():
            if chain.previous:
                version = self.registry.index.previous_target(name)
                if version is not None:
                    previous[name] = version
        snap = self._snapshot = _Snapshot(now, self.store.active(), fallbacks, previous)
        live = {rollout.id for rollout in snap.rollouts.values()}
        with self._lock:
            for rollout_id in [r for r in self._windows if r not in live]:  # ended elsewhere: promoted, aborted
                del self._windows[rollout_id]
        return snap

    def invalidate(self) -> None:
        self._snapshot = None

    def decide(self, resolved: Resolved, tenant: str, user: str | None, request_id: str,
               may_use: Visibility) -> Route:
        served = resolved.served
        manifest = served.manifest
        if manifest is None:
            return Route("direct", served)
        if not resolved.follows_rollouts:
            return self._remember(request_id, Route("pinned", served))
        snap = self.refresh()
        name = manifest.name
        rollout = snap.rollouts.get(name)
        if rollout is None or rollout.stable_version != manifest.version:
            return self._remember(request_id, Route("direct", served, self._chain(snap, served, may_use)))
        arm = arm_of(rollout, user, tenant, request_id)
        candidate = self._served(served, name, rollout.candidate_version)
        policy = "ab" if rollout.sticky else "canary"
        if arm == CANDIDATE_ARM and candidate is not None:
            route = Route(policy, candidate, (served, *self._base(served, snap, may_use)), rollout, arm)
        else:
            shadow = candidate if candidate is not None and shadows(rollout, arm, request_id) else None
            route = Route(policy, served, self._chain(snap, served, may_use), rollout, arm, shadow)
        self.metrics.routed.labels(self.metrics.label(name), arm).inc()
        return self._remember(request_id, route)

    def _remember(self, request_id: str, route: Route) -> Route:
        """Until `observe` reads the request's outcome (every account is closed, so every entry leaves)."""
        with self._lock:
            self._routes[request_id] = _Tracked(route)
        return route

    def landed(self, request_id: str, served: ServedModel, primary_failed: int | None) -> None:
        """What the load step brought in for the request (its outcome feeds that version's breaker), and the status
        a candidate that could not serve counts as (`api.routing.landing.Landing`)."""
        with self._lock:
            tracked = self._routes.get(request_id)
            if tracked is not None:
                tracked.served, tracked.primary_failed = served, primary_failed

    def _chain(self, snap: _Snapshot, served: ServedModel, may_use: Visibility) -> tuple[ServedModel, ...]:
        chain = []
        previous = snap.previous.get(served.name)
        if previous is not None and previous != served.manifest.version:
            fallback = self._served(served, served.name, previous)
            if fallback is not None:
                chain.append(fallback)
        return (*chain, *self._base(served, snap, may_use))

    @staticmethod
    def _base(served: ServedModel, snap: _Snapshot, may_use: Visibility) -> tuple[ServedModel, ...]:
        chain = snap.fallbacks.get(served.name)
        if chain is not None and chain.base and may_use(None):
            return (ServedModel(served.base_model_id, None),)
        return ()

    def _served(self, like: ServedModel, name: str, version: int) -> ServedModel | None:
        """A version as a ServedModel (versions are immutable, so their manifests are cached); None if gone."""
        key = (name, version)
        manifest = self._manifests.get(key)
        if manifest is None:
            try:
                manifest = self.registry.index.get(name, version)
            except VersionNotFound:
                return None
            self._manifests[key] = manifest
        return ServedModel(like.base_model_id, manifest)

    # The primary's output, for shadows and A/B logprobs

    async def tap(self, route: Route, deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChoiceDelta]:
        """Passes the deltas through, keeping the token ids and logprobs in `route.tap`; resolves its `finished`
        at the end."""
        tap = route.tap
        try:
            async for delta in deltas:
                tap.output.setdefault(delta.index, []).extend(delta.token_ids)
                for position in delta.logprobs or ():
                    tap.logprob_sum += position.chosen.logprob
                    tap.logprob_count += 1
                yield delta
        except BaseException:
            if tap.finished is not None and not tap.finished.done():
                tap.finished.cancel()
            raise
        if tap.finished is not None and not tap.finished.done():
            tap.finished.set_result(tap.output)

    # Observe

    def observe(self, outcome: RequestOutcome) -> None:
        """Reads one finished request (in the accounts' worker thread): breakers, arm outcome, guard. Batch
        lines feed the breakers only: rollout comparisons and guards are about live traffic."""
        with self._lock:
            tracked = self._routes.pop(outcome.attempt_id or outcome.request_id, None)
        if tracked is None:
            return
        route, tap = tracked.route, tracked.route.tap
        if tap.finished is not None and not tap.finished.done():
            tap.finished.get_loop().call_soon_threadsafe(_cancel, tap.finished)
        if tracked.served is not None:
            self._feed_breaker(tracked.served, outcome.status)
        rollout = route.rollout
        if rollout is None or outcome.priority == BATCH_PRIORITY:
            return
        primary_failed = tracked.primary_failed
        status = primary_failed or outcome.status
        ttft = None if primary_failed else outcome.ttft_seconds
        tpot = None if primary_failed else outcome.tpot_seconds
        logprob = tap.logprob_sum / tap.logprob_count if tap.logprob_count else None
        try:
            self.store.record([ArmOutcome(outcome.request_id, rollout.id, route.arm, outcome.tenant, status, ttft,
                                          tpot, outcome.completion_tokens, outcome.cost_usd, logprob,
                                          outcome.finished_at)])
        except Exception:
            logger.exception("could not record the outcome of %s for rollout %d", outcome.request_id, rollout.id)
        if route.arm == CANDIDATE_ARM:
            self._judge(rollout, status, ttft)

    def _feed_breaker(self, served: ServedModel, status: int) -> None:
        if served.manifest is None:
            return
        breaker = self.breakers.of(served.id)
        if status in (500, 504):
            breaker.failure()
        elif status < 400:
            breaker.success()
        else:
            breaker.abandon()

    def _judge(self, rollout: Rollout, status: int, ttft: float | None) -> None:
        with self._lock:
            window = self._windows.get(rollout.id)
            if window is None:
                window = self._windows[rollout.id] = GuardWindow(rollout.guard)
            now = self._clock()
            window.add(now, status >= 500, ttft)
            reason = window.breach(now)
            if reason is None:
                return
            del self._windows[rollout.id]
        try:
            self.store.end(rollout.name, "rolled_back", reason, rollout_id=rollout.id)
        except Exception:  # already ended (promoted, aborted, or rolled back by another server)
            logger.info("rollout %d of %s had already ended when its guard tripped", rollout.id, rollout.name)
            return
        self.invalidate()
        self.metrics.rollbacks.labels(self.metrics.label(rollout.name)).inc()
        logger.warning("rolled back %s -> %s automatically: %s", rollout.candidate_label, rollout.stable_label, reason)


def _cancel(future: asyncio.Future) -> None:
    if not future.done():
        future.cancel()
