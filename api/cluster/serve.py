"""The server of the scale-out mode: today's server (auth, limits, admission, ledger, routes) around a
`RayEngineClient` whose engine replicas run on Ray Serve.

With one such server in front, its in-process limits and ledger are exact for every replica; several servers in
front of one deployment need limits and a ledger they share (Redis, PostgreSQL).
"""

from __future__ import annotations

from adapters.registry import Registry
from api.config import LoraplexConfig
from api.server.build import build_server
from api.server.holder import Server
from engine.async_engine import model_id_of
from engine.cluster.client import ClusterTiers, RayEngineClient
from engine.cluster.deploy import EngineDeployment
from engine.cluster.replica import ReplicaSpec


def build_cluster_server(registry: Registry, config: LoraplexConfig) -> Server:
    """The replicas deploy when the app starts (`RayEngineClient.start`) and go when it stops; each keeps its own
    adapter tiers, and preloads `config.pins` and the adapters `config.cluster.adapter_replicas` places on it."""
    spec = ReplicaSpec(config.engine, config.registry, config.pins, config.serving.otlp_endpoint,
                       config.cluster.adapter_replicas)
    deployment = EngineDeployment(config.cluster, spec, config.serving.drain_timeout_s)
    engine = RayEngineClient(deployment, model_id_of(config.engine))
    return build_server(engine, registry, config, tiers=ClusterTiers(engine), cluster=engine)
