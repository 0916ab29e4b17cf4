"""`RayEngineClient`: the `EngineClient` of the scale-out mode. Each `generate` is one streaming call on the engine
replicas' deployment handle; the handle's router picks the replica (`router.AdapterAffinityRouter`).

Adapters: the server's loader "acquires" a version here (`ClusterTiers`), which only remembers its manifest; the
replica that runs the request fetches and loads it through its own tiers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from grpc.aio import AioRpcError
from ray.exceptions import RayError, RayTaskError
from vllm.tokenizers.registry import get_tokenizer

from adapters.identity import AdapterIdentity, LocatedAdapter
from adapters.manifest import Manifest
from adapters.tiers import Acquired
from engine.cluster.config import HOP_GRPC, ClusterConfig
from engine.cluster.deploy import EngineDeployment
from engine.cluster.report import ReplicaReport
from engine.tracing import carrier
from engine.types import ChoiceDelta, EngineDeadError, EngineError, EngineLoad, EngineRequestError

logger = logging.getLogger(__name__)

FOUND_ON_REPLICA = "replica"
START_ATTEMPTS = 3  # `Acquired.found_in` here: where it is loaded is the replica's business


def handle_options(cluster: ClusterConfig) -> dict:
    """Streaming calls; `_by_reference=False` is Ray Serve's direct transport, to the replica's own gRPC server."""
    return {"stream": True, "_by_reference": cluster.hop_transport != HOP_GRPC}


class RayEngineClient:
    def __init__(self, deployment: EngineDeployment, model_id: str):
        self.deployment = deployment
        self.model_id = model_id
        self.max_model_len = deployment.spec.engine.max_model_len
        self._handle = None
        self._tokenizer = None
        self._streams: dict[str, object] = {}  # request id -> its DeploymentResponseGenerator
        self._manifests: dict[AdapterIdentity, Manifest] = {}
        self._manifest_users: Counter[AdapterIdentity] = Counter()
        self.reports: dict[str, ReplicaReport] = {}  # replica id -> its latest report
        self.routed: Counter[str] = Counter()  # replica id -> requests it took

    def start(self) -> None:
        self._tokenizer = get_tokenizer(self.deployment.spec.engine.model)
        self._handle = self.deployment.start().options(**handle_options(self.deployment.cluster))

    def shutdown(self) -> None:
        self._handle = None
        self.deployment.stop()

    def tokenizer(self):
        return self._tokenizer

    def remember(self, manifest: Manifest) -> None:
        self._manifests[manifest.identity] = manifest
        self._manifest_users[manifest.identity] += 1

    def forget(self, identity: AdapterIdentity) -> None:
        self._manifest_users[identity] -= 1
        if self._manifest_users[identity] <= 0:
            del self._manifest_users[identity]
            self._manifests.pop(identity, None)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params, adapter: LocatedAdapter | None,
                       cache_salt: str | None = None) -> AsyncIterator[list[ChoiceDelta]]:
        """One streaming call; a replica lost before it started the request (its report not yet back) is
        retried on another, one lost later ends the stream with EngineError."""
        if self._handle is None:
            raise EngineDeadError("the engine replicas are not deployed")
        manifest = self._manifests[adapter.identity] if adapter is not None else None
        key = adapter.identity.label if adapter is not None else None
        window_s = self.deployment.cluster.hop_window_ms / 1000
        for attempt in range(1, START_ATTEMPTS + 1):
            stream = self._handle.generate.remote(request_id, prompt_token_ids, params, manifest, cache_salt,
                                                  adapter_key=key, trace_carrier=carrier(), window_s=window_s)
            self._streams[request_id] = stream
            replica_id = None
            finished = False
            try:
                async for item in stream:
                    if isinstance(item, ReplicaReport):  # first and last
                        if replica_id is None:
                            replica_id = item.replica_id
                            self.routed[replica_id] += 1
                        self.reports[replica_id] = item
                        continue
                    for step in item:  # the steps the replica gathered into one item
                        yield step
                finished = True
                return
            except RayTaskError as e:
                raise _cause(e) from e
            except (RayError, AioRpcError) as e:  # the replica died or became unreachable (either transport)
                if replica_id is not None:
                    self.reports.pop(replica_id, None)  # gone: it no longer holds anything
                if replica_id is not None or attempt == START_ATTEMPTS:
                    raise EngineError(f"engine replica lost while running request {request_id}: "
                                      f"{type(e).__name__}") from e
                logger.warning("replica lost before request %s started (%s); routing it again", request_id,
                               type(e).__name__)
            finally:
                self._streams.pop(request_id, None)
                if not finished:
                    stream.cancel()

    async def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.cancel()

    def is_alive(self) -> bool:
        return self._handle is not None

    def load(self) -> EngineLoad:
        """Summed over the replicas' latest reports."""
        reports = list(self.reports.values())
        usage = max((r.kv_cache_usage for r in reports), default=0.0)
        return EngineLoad(running=sum(r.running for r in reports), waiting=sum(r.waiting for r in reports),
                          kv_cache_usage=usage, generation_tokens=sum(r.generation_tokens for r in reports))

    def num_unfinished_requests(self) -> int:
        return len(self._streams)

    async def status(self) -> dict:
        """Every replica that served a request (its latest report and how many it took) and the replicas by state."""
        states = await asyncio.to_thread(self.deployment.replica_states)
        replicas = [{**dataclasses.asdict(r), "requests": self.routed[rid]} for rid, r in sorted(self.reports.items())]
        return {"routing": self.deployment.cluster.routing, "replica_states": states, "replicas": replicas}


def _cause(e: RayTaskError) -> Exception:
    """The replica's own exception, as the engine types the serving code maps to OpenAI errors."""
    cause = e.cause
    if isinstance(cause, (EngineError, EngineRequestError)):
        return cause
    if isinstance(cause, ValueError):
        return EngineRequestError(str(cause))
    return EngineError(f"engine replica failed: {type(cause).__name__}: {cause}")


class ClusterTiers:
    """The adapter tiers as the server sees them in scale-out mode: each replica holds its own; this remembers the
    manifests of versions in use so the client can send them along, and shows residency per replica."""

    def __init__(self, client: RayEngineClient):
        self._client = client

    async def acquire(self, manifest: Manifest) -> Acquired:
        self._client.remember(manifest)
        # Not a local folder: the replica that runs the request fetches its own copy.
        return Acquired(LocatedAdapter(manifest.identity, Path()), FOUND_ON_REPLICA, 0.0)

    def release(self, acquired: Acquired) -> None:
        self._client.forget(acquired.adapter.identity)

    async def prefetch(self, manifest: Manifest) -> None:
        pass  # which replica runs the request is decided when it runs; that replica loads the adapter then

    async def evict(self, manifest: Manifest) -> bool:
        return False

    def on_step(self, running_by_engine_name: dict[str, int]) -> None:
        pass  # each replica mirrors its own engine slots

    def residency(self) -> dict[str, list[str]]:
        """Per tier, every label resident on some replica (the dashboard's counts); per replica: `by_replica`."""
        merged: dict[str, list[str]] = {}
        for report in self._client.reports.values():
            for tier, labels in report.residency.items():
                merged.setdefault(tier, [])
                merged[tier] += [label for label in labels if label not in merged[tier]]
        return merged

    def by_replica(self) -> dict[str, dict[str, list[str]]]:
        return {rid: r.residency for rid, r in self._client.reports.items()}
