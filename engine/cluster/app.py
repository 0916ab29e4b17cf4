"""The engine replicas as a Serve application builder, for operators who deploy them with Ray's own tools: a
KubeRay RayService's `serveConfigV2` names `import_path: engine.cluster.app:build` with `args` (below), and the
loraplex server joins with `serve --replicas N --ray-address ... --attach`.

args: {"engine": EngineConfig fields, "registry": RegistryConfig fields, "cluster": ClusterConfig fields (its
`adapter_replicas` too), "pins": [names], "drain_timeout_s": seconds, "otlp_endpoint": URL}. `deployments:` entries
of the Serve config override replica counts, autoscaling and the router as usual.
"""

from __future__ import annotations

from ray.serve.deployment import Application

from adapters.registry import RegistryConfig
from engine.cluster.config import ClusterConfig
from engine.cluster.deploy import engine_application
from engine.cluster.replica import ReplicaSpec
from engine.config import EngineConfig

DEFAULT_DRAIN_S = 30.0


def build(args: dict) -> Application:
    cluster = ClusterConfig(**{"replicas": 1, **args.get("cluster", {})})
    spec = ReplicaSpec(EngineConfig(**args["engine"]), RegistryConfig(**args.get("registry", {})),
                       tuple(args.get("pins", ())), args.get("otlp_endpoint"), cluster.adapter_replicas)
    return engine_application(cluster, spec, float(args.get("drain_timeout_s", DEFAULT_DRAIN_S)))
