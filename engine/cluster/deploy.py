"""Starts (or joins) Ray, deploys the engine replicas on Ray Serve, and tears it all down."""

from __future__ import annotations

import logging
import os
import signal

import ray
from ray import serve
from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig
from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle

from engine.cluster.autoscale import AdapterQueuePolicy
from engine.cluster.config import ROUTING_AFFINITY, ClusterConfig
from engine.cluster.replica import EngineReplica, ReplicaSpec
from engine.cluster.router import AdapterAffinityRouter

logger = logging.getLogger(__name__)

APP_NAME = "loraplex"
DEPLOYMENT_NAME = "engine"
NAMESPACE = "loraplex"
HEALTH_CHECK_PERIOD_S = 2.0  # a replica whose engine died is replaced within seconds
# A small object store: only deltas and reports cross it (Ray's default reserves 30% of memory).
OBJECT_STORE_BYTES = 256 * 2**20
# Variables every replica needs, wherever Ray started its worker (the server's LoRA compile and trim switches too).
_FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "LORAPLEX_HOME", "VLLM_CPU_KVCACHE_SPACE",
                  "PYTHONPATH", "LORAPLEX_LORA_COMPILE", "LORAPLEX_MALLOC_TRIM_S")


def _autoscaling(cluster: ClusterConfig) -> AutoscalingConfig:
    return AutoscalingConfig(min_replicas=cluster.min_replicas, max_replicas=cluster.max_replicas,
                             initial_replicas=cluster.replicas, target_ongoing_requests=cluster.target_ongoing_requests,
                             upscale_delay_s=cluster.upscale_delay_s, downscale_delay_s=cluster.downscale_delay_s,
                             policy=AutoscalingPolicy(
                                 policy_function=f"{AdapterQueuePolicy.__module__}:{AdapterQueuePolicy.__name__}",
                                 policy_kwargs={"target_adapter_waiting": cluster.target_adapter_waiting}))


def _router(cluster: ClusterConfig) -> RequestRouterConfig:
    if cluster.routing == ROUTING_AFFINITY:
        return RequestRouterConfig(request_router_class=AdapterAffinityRouter,
                                   request_router_kwargs={"max_ongoing": cluster.affinity_max_ongoing,
                                                          "max_waiting": cluster.target_adapter_waiting},
                                   request_routing_stats_period_s=cluster.replica_stats_period_s)
    return RequestRouterConfig(request_routing_stats_period_s=cluster.replica_stats_period_s)


def alive_nodes() -> int:
    """Nodes of the Ray cluster that are alive and offer CPUs (Ray must be initialised)."""
    return sum(1 for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0)


def engine_application(cluster: ClusterConfig, spec: ReplicaSpec, drain_timeout_s: float,
                       nodes: int = 1) -> Application:
    """The engine replicas as a Serve application: what `serve --replicas` deploys, and what an operator's
    RayService deploys through `engine.cluster.app:build`. `nodes`: alive nodes, for the per-node cap."""
    options: dict = {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": cluster.max_ongoing_requests,
        # The worker Ray starts for a replica takes its niceness from this variable (its engine's processes are its
        # children, so they inherit it); the server's own variables reach it through the job's runtime env.
        "ray_actor_options": {"num_cpus": cluster.replica_num_cpus,
                              "runtime_env": {"env_vars": {"RAY_worker_niceness": str(cluster.replica_niceness)}}},
        "request_router_config": _router(cluster),
        "graceful_shutdown_timeout_s": drain_timeout_s,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
    }
    cap = cluster.per_node_cap(nodes)
    if cap is not None:
        options["max_replicas_per_node"] = cap
    if cluster.autoscale:
        options["autoscaling_config"] = _autoscaling(cluster)
    else:
        options["num_replicas"] = cluster.replicas
    return serve.deployment(EngineReplica).options(**options).bind(spec)


class EngineDeployment:
    """The Ray side of a `--replicas` server: `start` returns the handle the server's engine client calls."""

    def __init__(self, cluster: ClusterConfig, spec: ReplicaSpec, drain_timeout_s: float):
        self.cluster = cluster
        self.spec = spec
        self.drain_timeout_s = drain_timeout_s
        self._started_ray = False

    def start(self) -> DeploymentHandle:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
        if not ray.is_initialized():
            # ray.init replaces the SIGTERM handler with one that exits at once; the server's drain keeps its own.
            handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
            if self.cluster.ray_address is None:
                ray.init(namespace=NAMESPACE, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                         runtime_env={"env_vars": env}, log_to_driver=False)
            else:
                ray.init(address=self.cluster.ray_address, namespace=NAMESPACE, runtime_env={"env_vars": env},
                         log_to_driver=False)
            self._started_ray = True
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        serve.start(proxy_location="Disabled")
        if self.cluster.attach:
            logger.info("using the engine replicas already deployed as %s/%s", APP_NAME, DEPLOYMENT_NAME)
            return serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)
        nodes = alive_nodes()
        logger.info("deploying %s engine replicas on Ray Serve over %d node(s), at most %s per node",
                    self.cluster.replicas, nodes, self.cluster.per_node_cap(nodes) or "any number")
        return serve.run(engine_application(self.cluster, self.spec, self.drain_timeout_s, nodes), name=APP_NAME,
                         route_prefix=None)

    def replica_states(self) -> dict[str, int]:
        """Replicas by state (RUNNING, STARTING, ...), as the Serve controller sees them; a blocking call."""
        app = serve.status().applications.get(APP_NAME)
        if app is None or DEPLOYMENT_NAME not in app.deployments:
            return {}
        return {str(state.value if hasattr(state, "value") else state): count
                for state, count in app.deployments[DEPLOYMENT_NAME].replica_states.items()}

    def stop(self) -> None:
        """Deletes the replicas (each drains, then shuts its engine down) unless they were only attached to; stops
        Ray if this server started it."""
        if not ray.is_initialized():
            return
        try:
            if not self.cluster.attach:
                serve.delete(APP_NAME)
                serve.shutdown()
        finally:
            if self._started_ray:
                ray.shutdown()
