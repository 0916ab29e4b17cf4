"""A server's start (after its engine's) and its close (before the engine's shutdown, after the drain)."""

from __future__ import annotations

import logging

from adapters.identity import parse_model_ref
from api.server.holder import Server

logger = logging.getLogger(__name__)


async def start(server: Server) -> None:
    """Listen to the engine's steps, warm the pinned adapters (the replicas of the scale-out mode warm their own),
    start the background loops, then report ready."""
    add_listener = getattr(server.engine, "add_step_listener", None)
    if add_listener is not None:
        add_listener(lambda wall, tokens, busy: _on_step(server, wall, tokens, busy))
    if server.cluster is None:
        for name in server.config.pins:
            result = await server.admin.load(server.registry.resolve(parse_model_ref(name)))
            logger.info("pinned %s (%s)", result.model, result.found_in)
    server.loops.start()
    server.lifecycle.ready = True


def _on_step(server: Server, wall: float, tokens: int, busy: bool) -> None:
    server.meter.on_step(wall, tokens, busy)
    if server.tiers is not None:
        server.tiers.on_step(server.engine.load().running_by_adapter)


def close(server: Server) -> None:
    """Every store closed once what it holds is saved: unwritten ledger rows spilled, drift windows saved."""
    server.loops.stop()
    server.batches.store.close()
    server.responses.store.close()
    server.tracing.shutdown()
    server.pipeline.billing.spill()
    server.pipeline.limits.close()
    server.ledger.close()
    server.loops.save_drift()
    server.drift_store.close()
    server.registry.close()
