"""The tenants file: who may call the server, with which keys, limits, priority, prices and objectives.

Without a file the server runs the open default: one tenant `default`, no keys, every model, no limits.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints, ValidationError

from api.observability.slo import DEFAULT_SLO, SloTargets
from api.tenancy.virtual_models import VirtualModels
from engine.cluster.config import ClusterConfig

KEY_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
DEFAULT_CLASS = "standard"
BATCH_PRIORITY = "batch"  # the priority of batch lines in the ledger and logs; no class may take the name
OPEN_TENANT = "default"


class ConfigError(Exception):
    """Every problem of a tenants file, one per line, each starting with its location."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _check_key_hash(value: str) -> str:
    if not KEY_HASH_RE.match(value):
        raise ValueError("must be 'sha256:' followed by 64 lowercase hex digits (see `loraplex keys create`)")
    return value


KeyHash = Annotated[str, AfterValidator(_check_key_hash)]
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Glob = Annotated[str, StringConstraints(min_length=1, strip_whitespace=True)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenPrices(_Strict):
    """USD per million tokens."""

    prompt: float = Field(ge=0, description="USD per million prompt tokens.")
    completion: float = Field(ge=0, description="USD per million completion tokens.")


FREE = TokenPrices(prompt=0.0, completion=0.0)


class PricingConfig(_Strict):
    """Prices per model with a fallback."""

    default: TokenPrices | None = Field(
        default=None, description="Prices of models not listed under `models`; unset falls through "
        "(tenant) or means free (server).")
    models: dict[str, TokenPrices] = Field(
        default_factory=dict, description="Prices by base model id or adapter name.")
    batch_discount: float | None = Field(
        default=None, ge=0, le=1, description="Fraction taken off the price of batch lines (0.5: half price); "
        "unset falls through (tenant) or means 0.5 (server), OpenAI's batch discount.")


class AdmissionConfig(_Strict):
    """Bounded, fair waiting in front of the engine."""

    max_running: int | None = Field(default=None, gt=0, description="Sequences handed to the engine at once (a "
                                    "request runs prompts x n sequences); default: the engine's batch size "
                                    "(--max-num-seqs), times the most replicas in scale-out mode.")
    max_queued: int = Field(default=256, ge=0,
                            description="Requests waiting for an engine slot, all tenants together.")
    max_queued_per_tenant: int = Field(default=64, ge=0,
                                       description="Requests one tenant may have waiting: a flood fills its own "
                                                   "share of the queue, not everyone's.")
    max_queue_wait_s: float | None = Field(
        default=None, gt=0,
        description="Refuse (503 with Retry-After) a request that would wait longer than this for a slot, judged "
                    "from the queue ahead and the mean time a slot is held; keeps admitted requests within a "
                    "time-to-first-token objective under overload. None: only the queue lengths bound waiting.")
    reserve_window_s: float = Field(
        default=2.0, ge=0,
        description="A tenant with requests in flight keeps free slots up to the smaller of its fair share and "
                    "its peak concurrency over this many seconds; others borrow only the rest. 0: no claims "
                    "(fully work-conserving fair queueing).")
    max_batch_running_with_live: int = Field(
        default=0, ge=0,
        description="Slots batch lines may keep while live requests run; the rest are preempted when a live "
                    "request arrives. 0: batch lines run only on an engine with no live request (on a CPU, where "
                    "any batch work slows live steps); raise it on an accelerator with headroom.")
    adapter_aware: bool = Field(
        default=True,
        description="When requests wait for a slot, start first in a tenant's turn the one whose adapter already "
                    "runs, else sits in an engine slot, else fits within max_loras. false: each tenant's requests "
                    "in arrival order.")
    adapter_slot_wait_s: float = Field(
        default=2.0, ge=0,
        description="With adapter_aware, a request passed over this long goes next in its tenant's order.")
    batch_quiet_s: float = Field(
        default=2.0, ge=0,
        description="Batch lines take free slots only once no live request has run for this long, so a steady "
                    "trickle of live requests does not preempt batch lines restarted in every gap between them.")


class PriorityClass(_Strict):
    """A share of the engine and the objectives that come with it."""

    weight: float = Field(default=1.0, gt=0, description="Fair-share weight when tenants compete for slots.")
    slo: SloTargets | None = Field(default=None, description="Objectives; fields set here override the server's.")


class TenantLimits(_Strict):
    """Quotas of one tenant; an unset limit is unlimited."""

    requests_per_minute: int | None = Field(default=None, gt=0, description="Requests in any 60 s window.")
    tokens_per_minute: int | None = Field(
        default=None, gt=0, description="Prompt plus completion tokens in any 60 s window.")
    max_concurrent: int | None = Field(default=None, gt=0, description="Requests in flight at once.")
    tokens_per_day: int | None = Field(default=None, gt=0, description="Tokens per UTC calendar day.")
    tokens_per_month: int | None = Field(default=None, gt=0, description="Tokens per UTC calendar month.")
    max_tokens: int | None = Field(default=None, gt=0, description="Cap on `max_tokens` of one request.")
    max_batch_queued_tokens: int | None = Field(
        default=None, gt=0, description="Tokens (prompt plus output budget) of unfinished batch lines at once; "
        "a batch that would pass it fails validation with `token_limit_exceeded`.")


class MixtureLimits(_Strict):
    """Bounds on mixtures of adapters named per request (`model: "a*0.7+b@2*0.3"`, docs/registry.md)."""

    max_components: int = Field(default=4, ge=2, description="Most adapters in one mixture.")
    builds_per_minute: int = Field(default=10, ge=1, description="Distinct new mixtures one tenant may have built "
                                   "in any 60 s window (a mixture built before is served from the registry and "
                                   "does not count); past it, 429.")


class TenantConfig(_Strict):
    """One customer of the server."""

    name: Name = Field(description="Tenant id, as it appears in logs, metrics and the usage ledger.")
    key_hashes: list[KeyHash] = Field(default_factory=list, description="SHA-256 of each API key.")
    base_model: bool = Field(default=True, description="Whether the tenant may call the base model.")
    adapters: list[Glob] = Field(
        default_factory=list, description="Adapter names the tenant may call (fnmatch globs; ['*'] = all).")
    priority: str = Field(default=DEFAULT_CLASS, description="Name of the tenant's priority class.")
    limits: TenantLimits = Field(default_factory=TenantLimits, description="Quotas.")
    mixtures: bool = Field(default=False, description="Whether the tenant may name a weighted mixture of adapters "
                           "as `model` (each part one it may call); bounded by the file's `mixtures` section.")
    pricing: PricingConfig | None = Field(default=None, description="Prices that override the server's.")
    slo: SloTargets | None = Field(default=None, description="Objectives; fields set here override the class's.")


class TenancyConfig(_Strict):
    """The whole tenants file."""

    machine_cost_per_hour: float = Field(default=0.0, ge=0, description="USD per hour of this server's compute.")
    admin_key_hashes: list[KeyHash] = Field(default_factory=list, description="SHA-256 of each admin API key.")
    metrics_key_hashes: list[KeyHash] = Field(
        default_factory=list, description="SHA-256 of each metrics key: reads /metrics (a Prometheus scraper) and "
        "nothing else.")
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig, description="Engine slots and queue.")
    priority_classes: dict[Name, PriorityClass] = Field(
        default_factory=lambda: {DEFAULT_CLASS: PriorityClass(weight=1.0)},
        description="Priority classes by name.")
    pricing: PricingConfig = Field(default_factory=PricingConfig, description="Server-wide prices.")
    slo: SloTargets = Field(default=DEFAULT_SLO, description="Server-wide default objectives.")
    tenants: list[TenantConfig] = Field(min_length=1, description="Every tenant of the server.")
    mixtures: MixtureLimits = Field(default_factory=MixtureLimits, description="Bounds on per-request mixtures.")
    virtual_models: VirtualModels = Field(
        default_factory=dict, description="Cascades and ensembles over adapters, by the name callers send as "
        "`model` (api/tenancy/virtual_models.py); checked against the registry at start and on reload.")
    cluster: ClusterConfig | None = Field(default=None, description="Engine replicas on Ray Serve (`loraplex serve "
                                          "--replicas`); used when --replicas is not given on the command line.")

    _auth_required: bool = PrivateAttr(default=True)
    _by_name: dict[str, TenantConfig] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any) -> None:
        self._by_name = {t.name: t for t in self.tenants}

    @classmethod
    def open_default(cls) -> TenancyConfig:
        config = cls(tenants=[TenantConfig(name=OPEN_TENANT, adapters=["*"], mixtures=True)])
        config._auth_required = False
        return config

    @property
    def auth_required(self) -> bool:
        """False only for the open default, where every caller is the tenant `default`."""
        return self._auth_required

    def tenant(self, name: str) -> TenantConfig:
        """Raises KeyError for an unknown tenant."""
        return self._by_name[name]

    def weight_of(self, name: str) -> float:
        return self.priority_classes[self.tenant(name).priority].weight

    def slo_for(self, name: str) -> SloTargets:
        """Server default, then the fields the class sets, then the fields the tenant sets."""
        tenant = self.tenant(name)
        merged = self.slo.model_dump()
        for layer in (self.priority_classes[tenant.priority].slo, tenant.slo):
            if layer is not None:
                merged.update({f: getattr(layer, f) for f in layer.model_fields_set})
        return SloTargets.model_validate(merged)

    def may_use(self, name: str, adapter_name: str | None) -> bool:
        """`adapter_name` None means the base model."""
        tenant = self.tenant(name)
        if adapter_name is None:
            return tenant.base_model
        return any(fnmatch.fnmatchcase(adapter_name, glob) for glob in tenant.adapters)


def load_tenancy_config(path: str | Path) -> TenancyConfig:
    """Read and validate a tenants file; raises ConfigError listing every problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from e
    return parse_tenancy_config(read_yaml(text, str(path)))


def read_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{where}: YAML syntax error: {problem}"]) from e


def parse_tenancy_config(data: Any) -> TenancyConfig:
    """Validate parsed YAML; schema errors and cross-field problems are reported together."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"(top level): expected a mapping, got {type(data).__name__}"])
    problems: list[str] = []
    config = None
    try:
        config = TenancyConfig.model_validate(data)
    except ValidationError as e:
        problems += [f"{_location(err['loc'])}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()]
    problems += _cross_field_problems(data)
    if problems:
        raise ConfigError(problems) from None
    return config


def _location(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (name)"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out or "(top level)"


def _cross_field_problems(data: dict) -> list[str]:
    """Checks that span fields, read from the raw mapping so they run even when the schema check fails."""
    problems = []
    classes = data.get("priority_classes", {DEFAULT_CLASS: None})
    class_names = set(classes) if isinstance(classes, dict) else None
    if class_names is not None and BATCH_PRIORITY in class_names:
        problems.append(f"priority_classes.{BATCH_PRIORITY}: the name is reserved for batch lines")
    tenants = data.get("tenants")
    if not isinstance(tenants, list):
        return problems
    first_by_name: dict[str, int] = {}
    owner_by_hash: dict[str, str] = {}
    for i, tenant in enumerate(tenants):
        if not isinstance(tenant, dict):
            continue
        name = tenant.get("name")
        label = repr(name) if isinstance(name, str) else f"tenants[{i}]"
        if isinstance(name, str):
            if name in first_by_name:
                first = first_by_name[name]
                problems.append(f"tenants[{i}].name: duplicate tenant {name!r} (first at tenants[{first}])")
            else:
                first_by_name[name] = i
        priority = tenant.get("priority", DEFAULT_CLASS)
        if class_names is not None and isinstance(priority, str) and priority not in class_names:
            defined = ", ".join(sorted(map(str, class_names))) or "none"
            problems.append(f"tenants[{i}].priority: priority class {priority!r} is not defined (defined: {defined})")
        hashes = tenant.get("key_hashes")
        for j, key_hash in enumerate(hashes if isinstance(hashes, list) else []):
            if not isinstance(key_hash, str):
                continue
            if key_hash in owner_by_hash:
                problems.append(f"tenants[{i}].key_hashes[{j}]: key hash already belongs to tenant "
                                f"{owner_by_hash[key_hash]}")
            else:
                owner_by_hash[key_hash] = label
    return problems
