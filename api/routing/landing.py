"""The load step: the first option of a route ([primary, *chain]) that its circuit breaker lets through and that
loads within the deadline is brought into the engine. Where the primary could not serve, the `Landing` says why;
the last option's failure is the request's error."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from adapters.identity import LocatedAdapter
from adapters.rollouts import CANDIDATE_ARM
from api.errors import OpenAIError
from api.generation.accounting import RequestAccount
from api.generation.adapter_loading import AdapterLoader, AdapterLoadFailed
from api.generation.resolve import ServedModel
from api.routing.breaker import Breakers
from api.routing.metrics import RoutingMetrics
from api.routing.traffic import ROUTE_HEADER, Route

logger = logging.getLogger(__name__)

FALLBACK_HEADER = "x-loraplex-fallback"


@dataclass(frozen=True)
class Landing:
    """Which option of `route` serves, loaded into the engine."""

    route: Route
    served: ServedModel
    adapter: LocatedAdapter | None  # None: the base model
    fallback: str | None = None  # why the primary did not serve, when it did not
    primary_failed: int | None = None  # the status a candidate's failed load counts as, for its rollout's guard

    def headers(self) -> dict[str, str]:
        headers = {ROUTE_HEADER: self.route.header()}
        if self.fallback is not None:
            headers[FALLBACK_HEADER] = f"{self.route.primary.id};reason={self.fallback};served={self.served.id}"
        return headers

    def ledger_route(self) -> str:
        """How the ledger row names the route: the header, plus where a fallback came from."""
        text = self.route.header()
        if self.fallback is not None:
            text += f";fallback_from={self.route.primary.id};reason={self.fallback}"
        return text


class FallbackLoader:
    def __init__(self, loader: AdapterLoader, breakers: Breakers, metrics: RoutingMetrics, deadline_s: float):
        self.loader = loader
        self.breakers = breakers
        self.metrics = metrics
        self.deadline_s = deadline_s

    async def load(self, route: Route, account: RequestAccount) -> Landing:
        """503 (or the last option's own error) when no option can serve."""
        options = (route.primary, *route.chain)
        fallback: str | None = None
        primary_failed: int | None = None
        for i, served in enumerate(options):
            last = i == len(options) - 1
            breaker = self.breakers.of(served.id) if served.manifest is not None else None
            if breaker is not None and not breaker.allow():
                if last:
                    raise OpenAIError(503, f"{served.id} is not serving right now (its circuit breaker is open) "
                                      "and no fallback is configured.", code="breaker_open")
                reason, status = "breaker_open", 503
            else:
                try:
                    adapter = await asyncio.wait_for(self.loader.enter(served, account), self.deadline_s)
                except (AdapterLoadFailed, asyncio.TimeoutError) as e:
                    if breaker is not None:
                        breaker.failure()
                    if last:
                        if isinstance(e, asyncio.TimeoutError):
                            raise OpenAIError(503, f"Adapter {served.id} did not load within {self.deadline_s:g}s.",
                                              code="adapter_load_timeout") from e
                        raise e.http() from e
                    timed_out = isinstance(e, asyncio.TimeoutError)
                    reason = "load_timeout" if timed_out else "load_failed"
                    status = 503 if timed_out else e.status
                except BaseException:  # cancelled (the client left) or unforeseen: no verdict on the version
                    if breaker is not None:
                        breaker.abandon()
                    raise
                else:
                    return Landing(route, served, adapter, fallback, primary_failed)
            if fallback is None:
                fallback = reason
                primary_failed = status if route.arm == CANDIDATE_ARM else None
            self.metrics.fallbacks.labels(self.metrics.label(served.id), reason).inc()
            logger.warning("%s could not serve (%s); trying the next in its fallback chain", served.id, reason)
        raise AssertionError("unreachable: the last option returns or raises")
