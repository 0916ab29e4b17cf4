"""Typed configuration of the scale-out mode (`loraplex serve --replicas N`): Ray, replicas, routing, autoscaling.

This module never imports Ray: the single-process server reads it too (to know the mode is off).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ROUTING_AFFINITY = "affinity"
ROUTING_POWER_OF_TWO = "power_of_two"
HOP_GRPC = "grpc"


class ClusterConfig(BaseModel):
    """Engine replicas on Ray Serve behind this server. `replicas` None: one in-process engine, no Ray."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int | None = Field(default=None, ge=0, description="Engine replicas to deploy on Ray Serve "
                                 "(default: none, one engine in this process and Ray is not imported). With "
                                 "autoscaling, the replica count to start with.")
    ray_address: str | None = Field(default=None, description="Ray cluster to join, e.g. 127.0.0.1:6379 (default: "
                                    "start a local Ray instance for this server).")
    attach: bool = Field(default=False, description="Use the engine replicas already deployed on the Ray cluster "
                         "(a KubeRay RayService with engine.cluster.app:build) instead of deploying them; they stay "
                         "when this server stops.")
    routing: Literal["affinity", "power_of_two"] = Field(
        default=ROUTING_AFFINITY, description="Replica choice: 'affinity' sends a request to a replica holding its "
        "adapter unless that one is over --affinity-max-ongoing; 'power_of_two' is Ray Serve's default router.")
    affinity_max_ongoing: int = Field(default=8, ge=1, description="Ongoing requests above which a replica holding "
                                      "the adapter is passed over for the least loaded one (which loads it too).")
    max_ongoing_requests: int = Field(default=64, ge=1, description="Requests one replica runs at once; more wait "
                                      "in the router.")
    autoscale: bool = Field(default=False, description="Let Ray Serve add and remove replicas (between "
                            "--min-replicas and --max-replicas) on ongoing requests per replica and on the requests "
                            "waiting in the engines for each adapter.")
    min_replicas: int = Field(default=1, ge=0, description="Fewest replicas when autoscaling; 0 scales to zero "
                              "(the next request waits for a cold start).")
    max_replicas: int = Field(default=4, ge=1, description="Most replicas when autoscaling.")
    target_ongoing_requests: float = Field(default=16.0, gt=0, description="Ongoing requests per replica "
                                           "autoscaling aims at.")
    target_adapter_waiting: float = Field(default=4.0, gt=0, description="Requests waiting in the engines for one "
                                          "adapter, per replica holding it, above which autoscaling adds replicas "
                                          "(whatever the ongoing requests per replica); a holder with this many "
                                          "waiting is passed over by affinity routing.")
    upscale_delay_s: float = Field(default=10.0, ge=0, description="How long load must stay above target before "
                                   "a replica is added.")
    downscale_delay_s: float = Field(default=120.0, ge=0, description="How long load must stay below target before "
                                     "a replica is removed.")
    replica_stats_period_s: float = Field(default=1.0, gt=0, description="How often each replica reports its "
                                          "resident adapters and load to the router.")
    hop_window_ms: float = Field(default=20.0, ge=0, description="A stream's tokens cross the Ray hop from a "
                                 "replica to this server in batches: the first token at once, then what the engine "
                                 "made within this many ms, in one message (each message costs CPU at both ends, "
                                 "whatever it holds). 0: every engine step on its own.")
    hop_transport: Literal["grpc", "actor"] = Field(
        default=HOP_GRPC, description="How a request and its tokens cross to the replica: 'grpc' over the "
        "replica's own gRPC server (Ray Serve's direct transport: no Ray task per request, the first token sooner); "
        "'actor' as a Ray actor call, its tokens as Ray generator items.")
    replica_niceness: int = Field(default=0, ge=0, le=19, description="Niceness of each replica's process, and "
                                  "so of its engine's (Ray's own default for workers is 15, below its daemons and "
                                  "this server: the engine would yield the CPU to them on every token).")
    replica_num_cpus: float = Field(default=0.0, ge=0, description="CPUs Ray reserves per replica (0: schedule "
                                    "regardless; vLLM's own threads do the work).")
    adapter_replicas: dict[str, int] = Field(
        default_factory=dict, description="Adapters (NAME or NAME:ALIAS) that replicas hold from their start: N "
        "replicas each preload the adapter and never evict it, and its requests go to the least loaded of them "
        "(--adapter-replicas NAME=N, repeatable). `--pin` is held by every replica.")
    max_replicas_per_node: int | None = Field(
        default=None, ge=0, description="Most replicas Ray Serve places on one node (default: the most replicas "
        "there may be divided by the nodes alive at deploy time, rounded up, so replicas never all share a host "
        "while another has room; a replica of a lost node waits for a node with room. 0: no cap, Ray's soft "
        "spread only).")

    @property
    def enabled(self) -> bool:
        return self.replicas is not None

    def per_node_cap(self, nodes: int) -> int | None:
        """`max_replicas_per_node` for `nodes` alive nodes: set, or derived (None: no cap)."""
        if self.max_replicas_per_node is not None:
            return self.max_replicas_per_node or None
        most = self.most_replicas or 1
        return max(1, math.ceil(most / max(1, nodes)))

    @property
    def most_replicas(self) -> int | None:
        """The most replicas there may be at once (None: no replicas, one engine in process)."""
        return self.max_replicas if self.autoscale else self.replicas

    @model_validator(mode="after")
    def _cross_field(self) -> ClusterConfig:
        problems = []
        if self.autoscale and self.min_replicas > self.max_replicas:
            problems.append(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        if self.autoscale and self.replicas is not None and not (
                self.min_replicas <= self.replicas <= self.max_replicas):
            problems.append(f"replicas ({self.replicas}) must lie in [min_replicas, max_replicas] when autoscaling")
        if not self.autoscale and self.replicas == 0:
            problems.append("replicas must be >= 1 without autoscaling")
        if self.replicas is None and (self.ray_address is not None or self.autoscale or self.attach):
            problems.append("--ray-address, --autoscale and --attach need --replicas")
        for ref, wanted in self.adapter_replicas.items():
            if wanted < 1:
                problems.append(f"adapter_replicas: {ref} asks for {wanted} replicas; at least 1")
            elif self.most_replicas is not None and wanted > self.most_replicas:
                problems.append(f"adapter_replicas: {ref} asks for {wanted} replicas; there are at most "
                                f"{self.most_replicas}")
        if self.adapter_replicas and self.replicas is None:
            problems.append("--adapter-replicas needs --replicas")
        if self.attach and self.ray_address is None:
            problems.append("--attach needs --ray-address (the cluster the replicas run on)")
        if problems:
            raise ValueError("; ".join(problems))
        return self
