"""`LoraplexConfig`: everything one `loraplex serve` runs with, in sections, built once from the flags and the tenants
file, validated across sections and passed down whole. Each section's fields are its command-line flags
(`api.cli.flags`), so a setting has one name, one default and one description."""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapters.registry import RegistryConfig
from api.batch.config import BatchConfig
from api.input_limits import InputLimits
from api.observability.drift import DriftConfig
from api.openai.tool_parser import ToolCallParserName
from api.routing.config import RoutingConfig
from api.sagemaker.environment import PORT_ENV
from api.tenancy.config import TenancyConfig
from api.tenancy.limits_redis import DEFAULT_LEASE_S
from engine.cluster.config import ClusterConfig
from engine.config import EngineConfig


class ServerConfig(BaseModel):
    """Where and how the HTTP server listens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65535,
                      description=f"TCP port to bind; ${PORT_ENV}, when set, overrides it.")
    log_level: typing.Literal["debug", "info", "warning", "error"] = Field(default="info",
                                                                          description="Log level.")
    keep_alive_s: float = Field(default=75.0, gt=0, description="How long an idle HTTP/1.1 connection is kept "
                                "open. Longer than clients' own idle expiry (5 s in httpx, so in the openai SDK), so "
                                "that a client never sends on a connection the server is closing; behind a load "
                                "balancer, keep it above the balancer's idle timeout (60 s on AWS's ALB).")
    grpc_port: int | None = Field(default=None, ge=0, le=65535,
                                  description="Also serve the Open Inference Protocol v2 (KServe, Triton) over gRPC "
                                  "on this port of --host (0: a free one; the log says which). Default: HTTP only.")


class ServingOptions(BaseModel):
    """How the server around the engine behaves: tenants, ledger, drain, metrics, tracing, admin."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: str | None = Field(default=None, description="Tenants YAML (keys, limits, prices, SLOs); "
                               "without it the server runs open with one default tenant.")
    ledger_url: str | None = Field(default=None, description="Usage ledger: a SQLite file (a path or "
                                   "sqlite:///path), or postgresql://user@host/db for one ledger shared by replicas "
                                   "(default: $LORAPLEX_HOME/usage.sqlite).")
    limits_url: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://",
                                   description="Where tenant limits are counted: unset for this process alone, "
                                   "or redis://host:port/db to enforce them across every replica sharing that "
                                   "Redis.")
    limits_lease_s: float = Field(default=DEFAULT_LEASE_S, gt=0, description="With Redis limits: how long the "
                                  "slots and tokens of a replica that died stay reserved (a live one renews "
                                  "its leases every third of this).")
    ledger_synchronous: typing.Literal["NORMAL", "FULL"] = Field(
        default="NORMAL", description="SQLite synchronous mode of the ledger: NORMAL survives a killed "
        "process, FULL also a power loss.")
    drain_timeout_s: float = Field(default=30.0, ge=0, description="On SIGTERM, how long running requests "
                                   "may take to finish before the server exits.")
    metrics_top_n: int = Field(default=50, ge=1, description="Distinct tenants, models and adapters with "
                               "their own metric labels; the rest are labelled 'other'.")
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP endpoint for traces "
                                      "(default: no tracing).")
    prewarm_on_promote: bool = Field(default=False, description="Load an adapter version into the engine "
                                     "when it is promoted.")
    max_upload_bytes: int = Field(default=512 * 2**20, ge=1, description="Largest adapter archive the "
                                  "admin API accepts, in bytes.")
    chat_template: str | None = Field(default=None, description="A Jinja chat template file used instead of the "
                                      "model's own, as vLLM's --chat-template (default: the model's own; the "
                                      "smollm2 demo: its template that renders tools).")
    tool_call_parser: ToolCallParserName | None = Field(
        default=None, description="How tool_choice 'auto' finds the calls in a reply, as vLLM's "
        "--tool-call-parser: hermes (JSON objects in <tool_call> tags); without it 'auto' is refused (default: "
        "none; the smollm2 demo: hermes).")


# The sections whose fields are `loraplex serve` flags, in the order --help lists them.
FLAG_SECTIONS: dict[str, type[BaseModel]] = {
    "server": ServerConfig, "engine": EngineConfig, "registry": RegistryConfig, "serving": ServingOptions,
    "input_limits": InputLimits, "routing": RoutingConfig, "drift": DriftConfig, "batch": BatchConfig,
    "cluster": ClusterConfig,
}


class LoraplexConfig(BaseModel):
    """One server's configuration: the flag sections, the tenants file (`tenancy`) and the pinned adapters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineConfig
    server: ServerConfig = Field(default_factory=ServerConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    serving: ServingOptions = Field(default_factory=ServingOptions)
    input_limits: InputLimits = Field(default_factory=InputLimits)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig.open_default)
    pins: tuple[str, ...] = Field(default=(), description="Adapters kept loaded, never evicted (--pin).")

    @model_validator(mode="after")
    def _across_sections(self) -> LoraplexConfig:
        problems = []
        held = set(self.pins) | set(self.cluster.adapter_replicas)
        if len(held) >= self.engine.max_cpu_loras:
            problems.append(f"pins and adapter_replicas: {len(held)} adapters held loaded leave no room in "
                            f"max_cpu_loras {self.engine.max_cpu_loras}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def admission_size(self) -> int:
        """Sequences admitted to the engine(s) at once: the tenants file's `admission.max_running`, else the
        engine's batch size times the most replicas there may be."""
        if self.tenancy.admission.max_running is not None:
            return self.tenancy.admission.max_running
        return self.engine.max_num_seqs * max(1, self.cluster.most_replicas or 1)
