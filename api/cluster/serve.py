"""The server of the scale-out mode: today's server (auth, limits, admission, ledger, routes) around a
`RayEngineClient` whose engine replicas run on Ray Serve.

With one such server in front, its in-process limits and ledger are exact for every replica; several servers in
front of one deployment need limits and a ledger they share (Redis, PostgreSQL).
"""

from __future__ import annotations

from adapters.registry import Registry, RegistryConfig
from api.batch.config import BatchConfig
from api.input_limits import InputLimits
from api.observability.drift import DriftConfig
from api.routing.config import RoutingConfig
from api.server import Server, ServingOptions, build_server
from api.tenancy.config import TenancyConfig
from engine.async_engine import model_id_of
from engine.cluster.client import ClusterTiers, RayEngineClient
from engine.cluster.config import ClusterConfig
from engine.cluster.deploy import EngineDeployment
from engine.cluster.replica import ReplicaSpec
from engine.config import EngineConfig


def build_cluster_server(cluster: ClusterConfig, engine_config: EngineConfig, registry_config: RegistryConfig,
                         registry: Registry, tenancy: TenancyConfig, options: ServingOptions, pins: tuple[str, ...],
                         input_limits: InputLimits, routing: RoutingConfig, drift_config: DriftConfig,
                         batch_config: BatchConfig) -> Server:
    """The replicas deploy when the app starts (`RayEngineClient.start`) and go when it stops."""
    deployment = EngineDeployment(cluster, ReplicaSpec(engine_config, registry_config, pins,
                                                      options.otlp_endpoint), options.drain_timeout_s)
    engine = RayEngineClient(deployment, model_id_of(engine_config))
    most_replicas = cluster.max_replicas if cluster.autoscale else cluster.replicas
    return build_server(engine, registry, tenancy, options, None, (), max_running=engine_config.max_num_seqs
                        * max(1, most_replicas or 1), input_limits=input_limits, routing=routing,
                        drift_config=drift_config, batch_config=batch_config, remote_tiers=ClusterTiers(engine),
                        cluster=engine)
