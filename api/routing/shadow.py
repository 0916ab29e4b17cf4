"""Shadow traffic: a sampled copy of a live request runs on the rollout's candidate, is never returned, and never
delays a primary request.

A shadow takes admission slots only while nobody waits and one slot stays free (`FairAdmission.try_acquire_idle`),
and gives them back the moment a request has to wait (a wait listener cancels every running shadow, which aborts
its engine requests). Its output is compared with the primary's once both finished (exact match, token overlap)
and recorded in the registry index with its measured compute cost; that cost is internal: it is counted in
`loraplex_shadow_cost_usd_total` and `shadow_results`, never in the tenant's ledger rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from adapters.rollouts import RolloutStore, ShadowResult
from adapters.tiers import AdapterTiers
from api.generation.fanout import EngineCall, engine_deltas
from api.routing.metrics import RoutingMetrics
from api.routing.stats import token_overlap
from api.routing.traffic import Route
from api.tenancy.fair_admission import FairAdmission
from api.tenancy.ticket import Ticket
from engine.types import EngineClient

logger = logging.getLogger(__name__)

SHADOW_TENANT = "_shadow"  # admission's name for shadow slots (never a configured tenant: names can't start with _)
KEEP_FREE_SLOTS = 1


class ShadowRunner:
    def __init__(self, engine: EngineClient, queue: FairAdmission, tiers: AdapterTiers | None, store: RolloutStore,
                 metrics: RoutingMetrics, usd_per_token: Callable[[], float], load_deadline_s: float):
        self.engine = engine
        self.queue = queue
        self.tiers = tiers
        self.store = store
        self.metrics = metrics
        self.usd_per_token = usd_per_token
        self.load_deadline_s = load_deadline_s
        self._running: dict[asyncio.Task, bool] = {}  # task -> preempted
        queue.add_wait_listener(self.preempt)

    def start(self, route: Route, calls: list[EngineCall], cache_salt: str | None) -> None:
        """Starts the shadow of a routed request (if it has one and a slot is idle); call after its admission.
        `cache_salt` is the primary's: the copy shares prefix-cache blocks with its own tenant only."""
        if route.shadow is None or self.tiers is None:
            return
        label = self.metrics.label(route.shadow.name)
        manifest = route.shadow.manifest
        ticket = self.queue.try_acquire_idle(SHADOW_TENANT, sum(c.params.n for c in calls), KEEP_FREE_SLOTS,
                                             adapter=None if manifest is None else manifest.label)
        if ticket is None:
            self.metrics.shadows.labels(label, "skipped").inc()
            return
        route.tap.finished = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._run(route, calls, cache_salt, ticket))
        self._running[task] = False
        task.add_done_callback(lambda done: self._running.pop(done, None))

    def preempt(self) -> None:
        for task in list(self._running):
            if not task.done():
                self._running[task] = True
                task.cancel()

    async def _run(self, route: Route, calls: list[EngineCall], cache_salt: str | None, ticket: Ticket) -> None:
        shadow = route.shadow
        label = self.metrics.label(shadow.name)
        try:
            output, prompt_tokens = await self._generate(route, calls, cache_salt, ticket)
        except asyncio.CancelledError:
            self.metrics.shadows.labels(label, "preempted" if self._running.get(asyncio.current_task()) else
                                        "cancelled").inc()
            return
        except Exception:
            logger.exception("shadow of %s on %s failed", calls[0].request_id, shadow.id)
            self.metrics.shadows.labels(label, "failed").inc()
            return
        finished = route.tap.finished
        await asyncio.wait({finished})
        if finished.cancelled():  # the primary did not run to its end: nothing to compare with
            self.metrics.shadows.labels(label, "unmatched").inc()
            return
        primary = finished.result()
        choices = sorted(set(primary) | set(output))
        exact = all(primary.get(i, []) == output.get(i, []) for i in choices)
        overlap = sum(token_overlap(primary.get(i, []), output.get(i, [])) for i in choices) / max(1, len(choices))
        completion = sum(len(tokens) for tokens in output.values())
        cost = (prompt_tokens + completion) * self.usd_per_token()
        result = ShadowResult(route.rollout.id, calls[0].request_id, 200, exact, overlap, completion, cost, time.time())
        self.metrics.shadows.labels(label, "completed").inc()
        if exact:
            self.metrics.shadow_exact.labels(label).inc()
        self.metrics.shadow_cost.labels(label).inc(cost)
        try:
            await asyncio.to_thread(self.store.record_shadow, result)
        except Exception:
            logger.exception("could not record the shadow of %s", calls[0].request_id)

    async def _generate(self, route: Route, calls: list[EngineCall], cache_salt: str | None,
                        ticket: Ticket) -> tuple[dict[int, list[int]], int]:
        """The candidate's output per choice, and the prompt tokens it read; gives its slots back when done."""
        acquired = None
        try:
            acquired = await asyncio.wait_for(self.tiers.acquire(route.shadow.manifest), self.load_deadline_s)
            output: dict[int, list[int]] = {}
            for call in calls:
                copy = replace(call, request_id=f"shadow-{call.request_id}", params=call.params.clone())
                async for delta in engine_deltas(self.engine, acquired.adapter, copy, cache_salt):
                    output.setdefault(delta.index + call.choice_offset, []).extend(delta.token_ids)
            return output, sum(len(c.prompt_token_ids) for c in calls)
        finally:
            if acquired is not None:
                self.tiers.release(acquired)
            self.queue.release(ticket)
