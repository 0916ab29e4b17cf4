"""The three adapter tiers in front of the engine: engine slots, the engine's CPU cache, and the local disk.

The disk tier is `AdapterDiskCache` (blobs fetched from the registry's store). The CPU tier is vLLM's own
LoRA cache in the engine core; this class decides what leaves it (LRU, never a pinned adapter) by removing
a victim before loading a newcomer, so vLLM's own eviction never has to run. Engine slots are managed by
vLLM per step; they are mirrored here from the adapters each step ran, for hit/miss counts and residency.

Loads are single-flight per adapter and run off the event loop (fetch and validation in a thread; the engine
core reads the weights in its own process), so other streams keep flowing while an adapter loads; loads of
different adapters run side by side (the engine core still executes its add-LoRA calls one at a time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from adapters.identity import AdapterIdentity, LocatedAdapter
from adapters.manifest import Manifest

logger = logging.getLogger(__name__)

TIER_ENGINE, TIER_CPU, TIER_DISK = "engine", "cpu", "disk"
TIERS = (TIER_ENGINE, TIER_CPU, TIER_DISK)


class TierEvents(Protocol):
    """Where hits, misses, loads and evictions are reported (the server's metrics)."""

    def cache_hit(self, adapter: str, tier: str) -> None: ...

    def cache_miss(self, adapter: str, tier: str) -> None: ...

    def observe_load(self, tier: str, seconds: float) -> None: ...

    def evicted(self, adapter: str, tier: str) -> None: ...

    def set_resident(self, adapter: str, tier: str, resident: bool) -> None: ...


class DiskTier(Protocol):
    """The local-disk tier (`AdapterDiskCache`): pinned names are never evicted from disk."""

    def fetch(self, manifest: Manifest) -> tuple[Path, bool]: ...

    def pin(self, name: str) -> None: ...

    def unpin(self, name: str) -> None: ...


class AdapterEngine(Protocol):
    """What the tiers need from the engine (`LoraplexEngine`)."""

    def adapter_id(self, identity: AdapterIdentity) -> int: ...

    def engine_name(self, identity: AdapterIdentity) -> str: ...

    async def load_adapter(self, adapter: LocatedAdapter) -> None: ...

    async def unload_adapter(self, adapter_id: int) -> None: ...

    async def resident_adapter_ids(self) -> set[int]: ...


@dataclass(frozen=True)
class Acquired:
    """An adapter ready for the engine, and where it was found."""

    adapter: LocatedAdapter
    found_in: str  # the fastest tier that held it: engine, cpu, disk, or "store" (fetched)
    load_seconds: float


class EngineTiers(Protocol):
    """What the server asks of the tiers in front of its engine: `AdapterTiers`, or the scale-out mode's view of
    tiers each engine replica keeps for itself."""

    async def acquire(self, manifest: Manifest) -> Acquired: ...

    def release(self, acquired: Acquired) -> None: ...

    async def prefetch(self, manifest: Manifest) -> None: ...

    async def evict(self, manifest: Manifest) -> bool: ...

    def residency(self) -> dict[str, list[str]]: ...

    def on_step(self, running_by_engine_name: dict[str, int]) -> None: ...


class AdapterTiers:
    def __init__(self, engine: AdapterEngine, disk: DiskTier, validate: Callable[[Manifest, Path], object],
                 events: TierEvents, max_loras: int, max_cpu_loras: int, pinned: frozenset[str] = frozenset()):
        self._engine = engine
        self._disk = disk
        self._validate = validate
        self._events = events
        self._max_loras = max_loras
        self._max_cpu = max_cpu_loras
        self._pinned = pinned
        self._cpu: OrderedDict[int, LocatedAdapter] = OrderedDict()  # by engine adapter id, LRU first
        self._slots: OrderedDict[str, str] = OrderedDict()  # engine name -> label, LRU first
        self._in_use: Counter[int] = Counter()
        self._loading: dict[int, asyncio.Future[tuple[LocatedAdapter, str]]] = {}
        self._prefetched: set[int] = set()  # loaded ahead of a waiting request that has not acquired it yet
        self._loads_in_flight = 0
        self._engine_lock = asyncio.Lock()

    async def acquire(self, manifest: Manifest) -> Acquired:
        """The adapter, loaded into the engine's CPU cache; call `release` when its request ends."""
        started = time.monotonic()
        adapter, found_in = await self._ensure_loaded(manifest)
        adapter_id = self._engine.adapter_id(adapter.identity)
        self._in_use[adapter_id] += 1
        self._prefetched.discard(adapter_id)
        return Acquired(adapter, found_in, time.monotonic() - started)

    def release(self, acquired: Acquired) -> None:
        adapter_id = self._engine.adapter_id(acquired.adapter.identity)
        self._in_use[adapter_id] -= 1
        if self._in_use[adapter_id] <= 0:
            del self._in_use[adapter_id]

    async def _ensure_loaded(self, manifest: Manifest) -> tuple[LocatedAdapter, str]:
        identity, label = manifest.identity, manifest.label
        adapter_id = self._engine.adapter_id(identity)
        if self._engine.engine_name(identity) in self._slots:
            self._events.cache_hit(label, TIER_ENGINE)
            self._cpu.move_to_end(adapter_id)
            return self._cpu[adapter_id], TIER_ENGINE
        self._events.cache_miss(label, TIER_ENGINE)
        if adapter_id in self._cpu:
            self._events.cache_hit(label, TIER_CPU)
            self._cpu.move_to_end(adapter_id)
            return self._cpu[adapter_id], TIER_CPU
        self._events.cache_miss(label, TIER_CPU)
        return await asyncio.shield(self._loading_of(manifest, adapter_id))

    def _loading_of(self, manifest: Manifest, adapter_id: int) -> asyncio.Future[tuple[LocatedAdapter, str]]:
        pending = self._loading.get(adapter_id)
        if pending is None:
            # A task of its own, awaited through a shield: a requester that goes away (its client disconnected)
            # is cancelled alone, the load goes on for every other waiter.
            pending = asyncio.ensure_future(self._load(manifest, adapter_id))
            self._loading[adapter_id] = pending
            pending.add_done_callback(lambda done: self._load_done(adapter_id, done))
        return pending

    async def prefetch(self, manifest: Manifest) -> None:
        """Loads the adapter into the CPU tier ahead of its request (which is waiting for admission), unless it is
        there or loading, or room for it would cost an idle adapter not itself prefetched. Counts no hit or miss:
        the request's own `acquire` does."""
        adapter_id = self._engine.adapter_id(manifest.identity)
        if adapter_id in self._cpu or adapter_id in self._loading:
            return
        full = len(self._cpu) + self._loads_in_flight >= self._max_cpu
        if full and not any(self._in_use[i] == 0 and i not in self._prefetched for i in self._evictable()):
            return
        self._prefetched.add(adapter_id)
        try:
            await asyncio.shield(self._loading_of(manifest, adapter_id))
        except BaseException:
            self._prefetched.discard(adapter_id)
            raise

    def _load_done(self, adapter_id: int, done: asyncio.Future) -> None:
        self._loading.pop(adapter_id, None)
        if not done.cancelled():
            done.exception()  # retrieved here, so a failed load nobody awaits any more is not logged as lost

    async def _load(self, manifest: Manifest, adapter_id: int) -> tuple[LocatedAdapter, str]:
        # The engine may re-read the folder whenever it reloads the adapter, so the folder stays on disk
        # for as long as the adapter is in the CPU tier.
        self._disk.pin(manifest.name)
        try:
            return await self._load_pinned(manifest, adapter_id)
        except BaseException:
            self._disk.unpin(manifest.name)
            raise

    async def _load_pinned(self, manifest: Manifest, adapter_id: int) -> tuple[LocatedAdapter, str]:
        label = manifest.label
        started = time.monotonic()
        path, disk_hit = await asyncio.to_thread(self._disk.fetch, manifest)
        if disk_hit:
            self._events.cache_hit(label, TIER_DISK)
        else:
            self._events.cache_miss(label, TIER_DISK)
            self._events.observe_load(TIER_DISK, time.monotonic() - started)
        self._events.set_resident(label, TIER_DISK, True)
        await asyncio.to_thread(self._validate, manifest, path)
        adapter = LocatedAdapter(manifest.identity, path)
        # Room is made under the lock and held by `_loads_in_flight`; the load itself runs outside it, so loads of
        # different adapters do not wait on each other here.
        async with self._engine_lock:
            await self._make_room()
            self._loads_in_flight += 1
        loaded_at = time.monotonic()
        try:
            await self._engine.load_adapter(adapter)
        finally:
            self._loads_in_flight -= 1
        self._cpu[adapter_id] = adapter
        self._events.observe_load(TIER_CPU, time.monotonic() - loaded_at)
        self._events.set_resident(label, TIER_CPU, True)
        async with self._engine_lock:
            await self._reconcile()
        return adapter, TIER_DISK if disk_hit else "store"

    async def _make_room(self) -> None:
        """Evicts LRU unpinned adapters, idle ones first, until one more fits in the CPU tier beside the loads
        in flight."""
        while len(self._cpu) + self._loads_in_flight >= self._max_cpu:
            victim = self._victim()
            if victim is None:
                return  # everything is pinned: vLLM's own LRU decides
            await self._evict_id(victim)

    def _victim(self) -> int | None:
        """LRU among idle adapters not waited for, then idle prefetched ones, then any unpinned one."""
        unpinned = self._evictable()
        idle = [i for i in unpinned if self._in_use[i] == 0]
        candidates = [i for i in idle if i not in self._prefetched] or idle or unpinned
        return candidates[0] if candidates else None

    def _evictable(self) -> list[int]:
        return [i for i, a in self._cpu.items() if a.identity.name not in self._pinned]

    async def _evict_id(self, adapter_id: int) -> None:
        adapter = self._cpu.pop(adapter_id)
        # Out of the slot mirror too before the engine is asked: a request arriving meanwhile must load it anew.
        self._drop_slot(self._engine.engine_name(adapter.identity))
        await self._engine.unload_adapter(adapter_id)
        self._left_cpu(adapter.identity)

    def _left_cpu(self, identity: AdapterIdentity) -> None:
        self._prefetched.discard(self._engine.adapter_id(identity))
        self._events.evicted(identity.label, TIER_CPU)
        self._events.set_resident(identity.label, TIER_CPU, False)
        self._drop_slot(self._engine.engine_name(identity))
        self._disk.unpin(identity.name)

    async def _reconcile(self) -> None:
        """Drops from the mirror whatever the engine no longer holds. Only ids loaded before the engine was asked
        are checked: a load finishing meanwhile may not be in its answer."""
        known = list(self._cpu)
        resident = await self._engine.resident_adapter_ids()
        for adapter_id in [i for i in known if i not in resident and i in self._cpu]:
            self._left_cpu(self._cpu.pop(adapter_id).identity)

    def _drop_slot(self, engine_name: str) -> None:
        label = self._slots.pop(engine_name, None)
        if label is not None:
            self._events.set_resident(label, TIER_ENGINE, False)

    def on_step(self, running_by_engine_name: dict[str, int]) -> None:
        """Mirrors vLLM's slot LRU: every adapter that ran this step holds a slot, the least recent leave."""
        labels = {self._engine.engine_name(a.identity): a.identity.label for a in self._cpu.values()}
        for engine_name in running_by_engine_name:
            label = labels.get(engine_name)
            if label is None:
                continue
            if engine_name not in self._slots:
                self._events.set_resident(label, TIER_ENGINE, True)
            self._slots[engine_name] = label
            self._slots.move_to_end(engine_name)
        while len(self._slots) > self._max_loras:
            _, label = self._slots.popitem(last=False)
            self._events.evicted(label, TIER_ENGINE)
            self._events.set_resident(label, TIER_ENGINE, False)

    async def evict(self, manifest: Manifest) -> bool:
        """Admin: drop the adapter from the engine's caches. False if it was not there."""
        adapter_id = self._engine.adapter_id(manifest.identity)
        async with self._engine_lock:
            if adapter_id not in self._cpu:
                return False
            await self._evict_id(adapter_id)
        return True

    def engine_slots(self) -> frozenset[str]:
        """Labels in the engine's slots now (as of the last step)."""
        return frozenset(self._slots.values())

    def residency(self) -> dict[str, list[str]]:
        """Labels resident in the engine tiers, most recently used last."""
        return {TIER_ENGINE: list(self._slots.values()), TIER_CPU: [a.identity.label for a in self._cpu.values()]}

