"""The tier policy against a recording engine: hits and misses per tier, LRU eviction with pins, single
flight, and slot mirroring. The real engine's behaviour is in tests/e2e/test_registry_serving.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from adapters.identity import AdapterIdentity, LocatedAdapter
from adapters.manifest import Manifest
from adapters.tiers import AdapterTiers

HASH = "ab" * 32


def manifest(name: str, version: int = 1) -> Manifest:
    files = ({"path": "adapter_model.safetensors", "sha256": HASH, "size": 1},)
    return Manifest(name=name, version=version, description="", files=files, content_hash=f"{version:02d}" + HASH[2:],
                    peft_type="LORA", rank=8, alpha=16.0, target_modules=("q_proj",), base_model_id="base",
                    size_bytes=1, created_at="2026-12-02T00:00:00Z")


class Engine:
    def __init__(self):
        self.cpu: set[int] = set()
        self.loads: list[str] = []
        self.delay = 0.0
        self.fail = False
        self.attempts = 0

    def adapter_id(self, identity: AdapterIdentity) -> int:
        return hash((identity.name, identity.content_hash)) & 0xFFFFFF

    def engine_name(self, identity: AdapterIdentity) -> str:
        return f"{identity.name}#{identity.content_hash[:16]}"

    async def load_adapter(self, adapter: LocatedAdapter) -> None:
        self.attempts += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("injected load failure")
        self.loads.append(adapter.identity.name)
        self.cpu.add(self.adapter_id(adapter.identity))

    async def unload_adapter(self, adapter_id: int) -> None:
        self.cpu.discard(adapter_id)

    async def resident_adapter_ids(self) -> set[int]:
        return set(self.cpu)


class Disk:
    def __init__(self):
        self.held: set[str] = set()
        self.pins: dict[str, int] = {}

    def fetch(self, m: Manifest) -> tuple[Path, bool]:
        hit = m.name in self.held
        self.held.add(m.name)
        return Path("/adapters") / m.name, hit

    def pin(self, name: str) -> None:
        self.pins[name] = self.pins.get(name, 0) + 1

    def unpin(self, name: str) -> None:
        self.pins[name] -= 1


class Events:
    def __init__(self):
        self.log: list[tuple] = []

    def cache_hit(self, adapter, tier): self.log.append(("hit", adapter, tier))
    def cache_miss(self, adapter, tier): self.log.append(("miss", adapter, tier))
    def observe_load(self, tier, seconds): self.log.append(("load", tier))
    def evicted(self, adapter, tier): self.log.append(("evicted", adapter, tier))
    def set_resident(self, adapter, tier, resident): pass


def tiers(max_cpu: int = 2, pinned=frozenset()):
    engine, disk, events = Engine(), Disk(), Events()
    return AdapterTiers(engine, disk, lambda m, p: None, events, max_loras=1, max_cpu_loras=max_cpu,
                        pinned=pinned), engine, disk, events


async def test_found_in_each_tier():
    t, engine, disk, events = tiers()
    first = await t.acquire(manifest("a"))
    assert first.found_in == "store" and first.adapter.identity.label == "a@1"
    t.release(first)
    assert (await t.acquire(manifest("a"))).found_in == "cpu"
    t.on_step({engine.engine_name(first.adapter.identity): 1})
    assert (await t.acquire(manifest("a"))).found_in == "engine"
    assert ("miss", "a@1", "disk") in events.log and ("hit", "a@1", "engine") in events.log


async def test_lru_eviction_spares_pinned_and_unpins_disk():
    t, engine, disk, events = tiers(max_cpu=2, pinned=frozenset({"p"}))
    for name in ("p", "a", "b"):
        t.release(await t.acquire(manifest(name)))
    assert ("evicted", "a@1", "cpu") in events.log
    assert [label for label in t.residency()["cpu"]] == ["p@1", "b@1"]
    assert disk.pins == {"p": 1, "a": 0, "b": 1}
    again = await t.acquire(manifest("a"))
    assert again.found_in == "disk"  # evicted from CPU, still on disk


async def test_single_flight_load():
    t, engine, disk, events = tiers()
    engine.delay = 0.05
    results = await asyncio.gather(*(t.acquire(manifest("a")) for _ in range(5)))
    assert engine.loads == ["a"]
    assert {r.adapter.identity.name for r in results} == {"a"}


async def test_a_cancelled_first_requester_does_not_fail_the_others():
    """The first requester starts the load; its client goes away mid-load. The load goes on for the rest."""
    t, engine, disk, events = tiers()
    engine.delay = 0.05
    first = asyncio.ensure_future(t.acquire(manifest("a")))
    await asyncio.sleep(0.01)  # the load is under way
    others = [asyncio.ensure_future(t.acquire(manifest("a"))) for _ in range(3)]
    await asyncio.sleep(0)
    first.cancel()
    results = await asyncio.gather(*others)
    assert first.cancelled()
    assert engine.loads == ["a"] and all(r.found_in == "store" for r in results)
    assert (await t.acquire(manifest("a"))).found_in == "cpu"


async def test_a_failed_load_fails_every_waiter_and_the_next_request_retries():
    t, engine, disk, events = tiers()
    engine.delay, engine.fail = 0.02, True
    outcomes = await asyncio.gather(*(t.acquire(manifest("a")) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes) and engine.attempts == 1
    engine.fail = False
    assert (await t.acquire(manifest("a"))).found_in == "disk" and engine.attempts == 2


async def test_new_version_is_a_different_adapter():
    t, engine, disk, events = tiers()
    one, two = await t.acquire(manifest("a", 1)), await t.acquire(manifest("a", 2))
    assert one.adapter.identity.content_hash != two.adapter.identity.content_hash
    assert engine.loads == ["a", "a"]


async def test_slot_mirror_keeps_most_recent():
    t, engine, disk, events = tiers(max_cpu=3)
    a, b = await t.acquire(manifest("a")), await t.acquire(manifest("b"))
    t.on_step({engine.engine_name(a.adapter.identity): 1})
    t.on_step({engine.engine_name(b.adapter.identity): 1})
    assert t.residency()["engine"] == ["b@1"]
    assert ("evicted", "a@1", "engine") in events.log


class GatedEngine(Engine):
    """Loads of adapter `slow` wait until the test opens the gate."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()
        self.slow_loading = asyncio.Event()

    async def load_adapter(self, adapter: LocatedAdapter) -> None:
        if adapter.identity.name == "slow":
            self.slow_loading.set()
            await self.gate.wait()
        await super().load_adapter(adapter)


async def test_loads_of_different_adapters_do_not_wait_on_each_other():
    engine = GatedEngine()
    t = AdapterTiers(engine, Disk(), lambda m, p: None, Events(), max_loras=1, max_cpu_loras=2)
    slow = asyncio.ensure_future(t.acquire(manifest("slow")))
    fast = await asyncio.wait_for(t.acquire(manifest("fast")), timeout=5)
    assert fast.found_in == "store" and not slow.done()
    engine.gate.set()
    await slow
    assert t.residency()["cpu"] == ["fast@1", "slow@1"]


async def test_room_is_held_for_a_load_in_flight():
    engine = GatedEngine()
    t = AdapterTiers(engine, Disk(), lambda m, p: None, Events(), max_loras=1, max_cpu_loras=2)
    t.release(await t.acquire(manifest("a")))
    slow = asyncio.ensure_future(t.acquire(manifest("slow")))
    await engine.slow_loading.wait()  # slow has made its room and is in the engine
    # The tier is full with a and slow in flight: a leaves.
    t.release(await asyncio.wait_for(t.acquire(manifest("b")), timeout=5))
    engine.gate.set()
    t.release(await slow)
    assert sorted(t.residency()["cpu"]) == ["b@1", "slow@1"] and engine.cpu == {
        engine.adapter_id(manifest(n).identity) for n in ("b", "slow")}


async def test_prefetch_loads_ahead_without_counting_a_hit_or_miss():
    t, engine, _, events = tiers(max_cpu=2)
    await t.prefetch(manifest("a"))
    assert engine.loads == ["a"] and not [e for e in events.log if e[0] in ("hit", "miss") and e[2] != "disk"]
    await t.prefetch(manifest("a"))  # already in the CPU tier: nothing to do
    acquired = await t.acquire(manifest("a"))
    assert acquired.found_in == "cpu" and engine.loads == ["a"]
    t.release(acquired)


async def test_prefetch_evicts_only_an_idle_adapter_nobody_waits_for():
    t, engine, _, _ = tiers(max_cpu=2)
    held = await t.acquire(manifest("a"))
    await t.prefetch(manifest("b"))  # for a waiting request; the tier is full now
    await t.prefetch(manifest("c"))  # would evict b (prefetched, not yet acquired) or a (in use): skipped
    assert engine.loads == ["a", "b"]
    t.release(held)
    await t.prefetch(manifest("c"))  # a is idle now: it goes, b stays for its request
    assert engine.loads == ["a", "b", "c"] and (await t.acquire(manifest("b"))).found_in == "cpu"


async def test_a_request_during_an_eviction_loads_the_adapter_anew():
    class SlowUnload(Engine):
        def __init__(self):
            super().__init__()
            self.unloading = asyncio.Event()
            self.go_on = asyncio.Event()

        async def unload_adapter(self, adapter_id: int) -> None:
            self.unloading.set()
            await self.go_on.wait()
            await super().unload_adapter(adapter_id)

    engine = SlowUnload()
    t = AdapterTiers(engine, Disk(), lambda m, p: None, Events(), max_loras=1, max_cpu_loras=2)
    first = await t.acquire(manifest("a"))
    t.on_step({engine.engine_name(first.adapter.identity): 1})  # a holds the engine slot
    t.release(first)
    eviction = asyncio.create_task(t.evict(manifest("a")))
    await engine.unloading.wait()
    again = asyncio.create_task(t.acquire(manifest("a")))  # a is leaving: neither in a slot nor in the CPU tier
    await asyncio.sleep(0)
    engine.go_on.set()
    assert await eviction
    assert (await again).found_in == "disk" and engine.loads == ["a", "a"]
