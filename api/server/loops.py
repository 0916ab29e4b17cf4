"""`ServerLoops`: the one owner of a server's background work, started once the engine runs and stopped before it
shuts down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from api.batch.runner import BatchRunner
from api.jobs.runner import JobRunner
from api.observability.drift import DriftMonitor
from api.observability.drift_store import SAVE_INTERVAL_S, DriftStore
from api.observability.history import FINE
from api.tenancy.billing import LedgerWriter

logger = logging.getLogger(__name__)

HISTORY_SAMPLE_S = FINE.seconds
BILLING_RETRY_S = 2.0


class ServerLoops:
    """Dashboard history samples, ledger retries, drift saves, batch lines and async jobs."""

    def __init__(self, sample_history: Callable[[], None], billing: LedgerWriter, drift: DriftMonitor,
                 drift_store: DriftStore, batch_runner: BatchRunner, job_runner: JobRunner):
        self._sample_history = sample_history
        self._billing = billing
        self._drift = drift
        self._drift_store = drift_store
        self.batch_runner = batch_runner
        self.job_runner = job_runner
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loops: list[Coroutine[Any, Any, None]] = [self._sample(), self._retry_billing(), self._save_drift(),
                                                  self.batch_runner.run(), self.job_runner.run()]
        self._tasks = [asyncio.create_task(loop) for loop in loops]

    def stop(self) -> None:
        """Batch lines and jobs stop (they stay pending in the store, for the next start); the loops end."""
        self.batch_runner.stop_all()
        self.job_runner.stop_all()
        for task in self._tasks:
            task.cancel()

    def save_drift(self) -> None:
        try:
            self._drift_store.save(self._drift.export())
        except Exception:  # the next interval (or start) tries again; serving goes on
            logger.exception("saving drift windows failed")

    async def _sample(self) -> None:
        """The dashboard history's gauges, once per fine interval, for the life of the server."""
        while True:
            self._sample_history()
            await asyncio.sleep(HISTORY_SAMPLE_S)

    async def _retry_billing(self) -> None:
        """Usage rows the ledger refused are retried until it takes them (their tenants are refused meanwhile)."""
        while True:
            await asyncio.sleep(BILLING_RETRY_S)
            if self._billing.pending:
                await asyncio.to_thread(self._billing.retry_pending)

    async def _save_drift(self) -> None:
        """The drift windows to their store while they change (and once more at close)."""
        saved = self._drift.changes
        while True:
            await asyncio.sleep(SAVE_INTERVAL_S)
            if self._drift.changes != saved:
                saved = self._drift.changes
                await asyncio.to_thread(self.save_drift)
