"""The adapter a request runs with, brought into the engine through the tiers and held until close."""

from __future__ import annotations

import asyncio
import logging

from adapters.identity import LocatedAdapter
from adapters.manifest import Manifest
from adapters.tiers import EngineTiers
from adapters.validation import AdapterValidationError
from api.errors import OpenAIError
from api.generation.accounting import RequestAccount
from api.generation.resolve import ServedModel
from engine.tracing import Tracing
from engine.types import EngineError

logger = logging.getLogger(__name__)


class AdapterLoadFailed(Exception):
    """A version that could not be brought into the engine: `invalid` when it failed validation (the version
    itself is bad), otherwise the store, the disk or the engine failed. `http()` is what the caller is told."""

    def __init__(self, served_id: str, detail: str, invalid: bool):
        super().__init__(f"{served_id}: {detail}")
        self.served_id, self.detail, self.invalid = served_id, detail, invalid

    @property
    def status(self) -> int:
        return 500 if self.invalid else 503

    def http(self) -> OpenAIError:
        if self.invalid:
            return OpenAIError(500, f"Adapter {self.served_id} failed validation: {self.detail}", code="adapter_invalid")
        return OpenAIError(503, f"Adapter {self.served_id} could not be loaded: {self.detail}",
                           code="adapter_load_failed")


class AdapterLoader:
    """`tiers` None: no adapter tiers (the fake engine of HTTP-layer tests), every request runs on the base."""

    def __init__(self, tiers: EngineTiers | None, tracing: Tracing):
        self.tiers = tiers
        self.tracing = tracing
        self._prefetches: set[asyncio.Task] = set()

    def prefetch(self, manifest: Manifest | None) -> None:
        """Starts loading the adapter of a request that waits for admission into the CPU tier, so it is ready
        when the request starts. A failure is left to the request's own load, which reports it."""
        if manifest is None or self.tiers is None:
            return
        task = asyncio.create_task(self.tiers.prefetch(manifest))
        self._prefetches.add(task)
        task.add_done_callback(self._prefetched)

    def _prefetched(self, task: asyncio.Task) -> None:
        self._prefetches.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("prefetch failed: %s", task.exception())

    async def enter(self, served: ServedModel, account: RequestAccount) -> LocatedAdapter | None:
        """The adapter to run with (None for the base model); AdapterLoadFailed if it cannot be loaded."""
        if served.manifest is None or self.tiers is None:
            return None
        tiers = self.tiers
        with self.tracing.span("adapter.load", adapter=served.id):
            try:
                acquired = await tiers.acquire(served.manifest)
            except AdapterValidationError as e:
                raise AdapterLoadFailed(served.id, "; ".join(e.problems), invalid=True) from e
            except (EngineError, OSError, ValueError) as e:
                raise AdapterLoadFailed(served.id, str(e), invalid=False) from e
        account.cleanups.append(lambda a: tiers.release(acquired))
        return acquired.adapter
