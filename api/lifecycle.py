"""Readiness and graceful drain.

On SIGTERM the server keeps its socket open and answers new generation requests with 503 (so a load balancer
sees a clear refusal, not a reset), lets running requests finish for up to `drain_timeout_s`, then stops
uvicorn. Requests still running after the timeout are cancelled by uvicorn's graceful-shutdown timeout; the
lifespan waits for them to record their usage, then shuts the engine down; the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from api.http_protocol import bounded_protocol
from api.input_limits import InputLimits

logger = logging.getLogger(__name__)


class Lifecycle:
    """Ready, draining, and the count of generation requests in flight."""

    def __init__(self) -> None:
        self.ready = False
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # Run when draining starts: background work (batch lines) stops at once rather than hold the drain.
        self.on_drain: list[Callable[[], None]] = []

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """True when every request finished within the timeout."""
        self.draining = True
        for callback in self.on_drain:
            callback()
        return await self.wait_idle(timeout_s)

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when no request is in flight within the timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False


def http_config(app: ASGIApp, limits: InputLimits, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "info", *, keep_alive_s: float, graceful_timeout_s: float = 5.0) -> uvicorn.Config:
    """uvicorn's settings for the server: httptools with the request head bounded by `max_header_bytes`
    (a larger one gets a 431 and the connection is closed), idle connections kept `keep_alive_s`."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=bounded_protocol(limits.max_header_bytes), timeout_keep_alive=keep_alive_s,
                          timeout_graceful_shutdown=graceful_timeout_s)


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM turned into a drain before the usual shutdown."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, drain_timeout_s: float):
        super().__init__(config)
        self._lifecycle = lifecycle
        self._drain_timeout_s = drain_timeout_s
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self._drain_task is not None:
            super().handle_exit(sig, frame)
            return
        self._drain_task = asyncio.get_event_loop().create_task(self._drain_then_exit(sig, frame))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        started = time.monotonic()
        logger.info("SIGTERM: draining %d request(s), up to %.0f s", self._lifecycle.in_flight,
                    self._drain_timeout_s)
        finished = await self._lifecycle.drain(self._drain_timeout_s)
        logger.info("drain %s after %.1f s; shutting down",
                    "complete" if finished else f"timed out with {self._lifecycle.in_flight} left",
                    time.monotonic() - started)
        # Not `super().handle_exit`: uvicorn would re-raise the captured SIGTERM after shutdown, and the
        # process would end killed by it instead of exiting 0 after a completed drain.
        self.should_exit = True
