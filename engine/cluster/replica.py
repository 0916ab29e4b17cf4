"""One engine replica of the scale-out mode: a Ray Serve deployment holding one vLLM engine and its own adapter tiers.

The server's `RayEngineClient` calls `generate` through a deployment handle; the replica fetches the adapter version
from the registry's store into its own disk cache, loads it through its own tiers, streams the deltas (after a
`ReplicaReport` of itself), and releases the adapter. A cancelled call (the client went away, or the server aborted
it) cancels the generator here, and vLLM aborts the request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray import serve

from adapters.base_model import base_model_spec
from adapters.disk_cache import AdapterDiskCache
from adapters.identity import parse_model_ref
from adapters.manifest import Manifest
from adapters.registry import Registry, RegistryConfig
from adapters.tiers import TIER_CPU, AdapterTiers
from engine.adapter_ids import adapter_name_of
from engine.async_engine import LoraplexEngine
from engine.cluster.autoscale import autoscaling_stats
from engine.cluster.coalesce import coalesce
from engine.cluster.placement import held_here
from engine.cluster.report import ReplicaReport, ReplicaTierCounts
from engine.cluster.router import RESIDENT_STAT, WAITING_STAT
from engine.config import EngineConfig
from engine.tracing import Tracing
from engine.types import ChoiceDelta, EngineError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica is built from."""

    engine: EngineConfig
    registry: RegistryConfig
    pins: tuple[str, ...] = ()
    otlp_endpoint: str | None = None  # the server's: replica spans join the request's trace
    adapter_replicas: Mapping[str, int] = field(default_factory=dict)  # ClusterConfig.adapter_replicas


class EngineReplica:
    async def __init__(self, spec: ReplicaSpec):
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.node_id = ray.get_runtime_context().get_node_id()
        base = base_model_spec(Path(spec.engine.model))
        self.registry = Registry.from_config(spec.registry, base, spec.engine.max_lora_rank)
        self.counts = ReplicaTierCounts()
        held = held_here(spec.pins, spec.adapter_replicas, context.rank.rank, context.world_size)
        names = frozenset(parse_model_ref(ref).name for ref in held)
        # A disk cache of its own: two replicas on one node must not evict each other's folders.
        disk_dir = spec.registry.resolved_disk_cache_dir() / "replicas" / self.replica_id
        self.disk = AdapterDiskCache(disk_dir, spec.registry.disk_cache_bytes, self.registry.store)
        for name in names:
            self.disk.pin(name)
        self.engine = LoraplexEngine(spec.engine)
        self.engine.start()
        self.tiers = AdapterTiers(self.engine, self.disk, self.registry.check_folder, self.counts,
                                  spec.engine.max_loras, spec.engine.max_cpu_loras, names)
        for ref in held:  # before the replica takes requests: its first report shows them resident
            self.tiers.release(await self.tiers.acquire(self.registry.resolve(parse_model_ref(ref))))
        self.engine.add_step_listener(self._on_step)
        self.tracing = Tracing(spec.otlp_endpoint, service_name="loraplex-replica")
        self.ongoing = 0
        logger.info("engine replica %s (rank %d of %d) ready on node %s, holding %s", self.replica_id,
                    context.rank.rank, context.world_size, self.node_id, ", ".join(held) or "nothing")

    def _on_step(self, wall: float, tokens: int, busy: bool) -> None:
        self.tiers.on_step(self.engine.load().running_by_adapter)

    def report(self) -> ReplicaReport:
        load = self.engine.load()
        return ReplicaReport(self.replica_id, self.node_id, os.getpid(), self.tiers.residency(), load.running,
                             load.waiting, load.kv_cache_usage, self.ongoing, self.counts.engine_loads,
                             self.counts.engine_load_seconds, load.generation_tokens)

    def record_routing_stats(self) -> dict:
        """Ray Serve calls this every `request_routing_stats_period_s` and hands it to the router."""
        return {RESIDENT_STAT: self.tiers.residency()[TIER_CPU], WAITING_STAT: self._waiting_by_name(),
                "ongoing": self.ongoing}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve calls this every metrics period; `autoscale.AdapterQueuePolicy` reads it."""
        resident = {parse_model_ref(label).name for label in self.tiers.residency()[TIER_CPU]}
        return autoscaling_stats(self._waiting_by_name(), resident)

    def _waiting_by_name(self) -> dict[str, int]:
        """Requests waiting in the engine per adapter name (all its versions)."""
        waiting: dict[str, int] = {}
        for engine_name, count in self.engine.load().waiting_by_adapter.items():
            name = adapter_name_of(engine_name)
            waiting[name] = waiting.get(name, 0) + count
        return waiting

    async def generate(self, request_id: str, prompt_token_ids: list[int], params, manifest: Manifest | None,
                       cache_salt: str | None = None, adapter_key: str | None = None,
                       trace_carrier: dict[str, str] | None = None, window_s: float = 0.0
                       ) -> AsyncIterator[ReplicaReport | list[list[ChoiceDelta]]]:
        """A report of this replica, the engine's steps (each a list of deltas) in batches (`coalesce`: the first
        at once, then what `window_s` gathers), and a report again. `adapter_key` only steers the router;
        `trace_carrier` is the caller's span (W3C trace context). The adapter's own failures (validation, fetch)
        are EngineError: the request asked for nothing invalid."""
        self.ongoing += 1
        try:
            yield self.report()
            with self.tracing.span("replica.generate", carrier=trace_carrier, replica=self.replica_id,
                                   node=self.node_id, request_id=request_id,
                                   adapter=manifest.label if manifest is not None else None):
                try:
                    acquired = await self.tiers.acquire(manifest) if manifest is not None else None
                except (OSError, LookupError, ValueError) as e:  # AdapterValidationError is a ValueError
                    raise EngineError(f"adapter {manifest.label} could not be loaded on replica "
                                      f"{self.replica_id}: {e}") from e
                try:
                    adapter = acquired.adapter if acquired is not None else None
                    steps = self.engine.generate(request_id, prompt_token_ids, params, adapter, cache_salt)
                    async for batch in coalesce(steps, window_s):
                        yield batch
                finally:
                    if acquired is not None:
                        self.tiers.release(acquired)
        finally:
            self.ongoing -= 1
        yield self.report()  # and one at the end: what the request left resident

    def check_health(self) -> None:
        if not self.engine.is_alive():
            raise RuntimeError("the vLLM engine of this replica died")

    def __del__(self) -> None:
        tracing = getattr(self, "tracing", None)
        if tracing is not None:
            tracing.shutdown()  # flushes its spans
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
