"""A request's `model` to what serves it: the base model or one adapter version, for this caller.

The registry is read on every request, so adapters published, promoted or rolled back while the server
runs are seen by the next request; a request keeps the version it resolved to until it ends. The string is
parsed once here (`adapters.identity.parse_model_ref`, or `mixtures.parse_mixture` for a mixture of adapters) and
the result passed down whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adapters.identity import MIXTURE_PREFIX, AdapterIdentity, ModelRef, parse_model_ref
from adapters.manifest import Manifest
from adapters.registry import AdapterNotFound, Registry
from api.auth import Caller
from api.errors import OpenAIError, model_not_found
from api.generation.mixtures import Mixtures, canonical, is_mixture, parse_mixture
from api.tenancy.config import TenancyConfig, TenantConfig

# Whether a caller may use an adapter name (None: the base model).
Visibility = Callable[[str | None], bool]


def everything(name: str | None) -> bool:
    return True


def visibility_of(tenancy: TenancyConfig, caller: Caller) -> Visibility:
    return lambda adapter_name: tenancy.may_use(caller.tenant, adapter_name)


@dataclass(frozen=True)
class ServedModel:
    """What a request's `model` resolved to; `id` names the exact version that serves."""

    base_model_id: str
    manifest: Manifest | None  # None: the base model
    mixture: str | None = None  # a mixture's name by its parts (`mixtures.canonical`); its manifest is the built one

    @property
    def identity(self) -> AdapterIdentity | None:
        return self.manifest.identity if self.manifest is not None else None

    @property
    def id(self) -> str:
        if self.mixture is not None:
            return self.mixture
        return self.manifest.label if self.manifest is not None else self.base_model_id

    @property
    def name(self) -> str:
        if self.mixture is not None:
            return self.mixture
        return self.manifest.name if self.manifest is not None else self.base_model_id

    @property
    def version(self) -> str:
        """The adapter version, "" for the base model and a mixture (as metrics and the ledger label it)."""
        return str(self.manifest.version) if self.manifest is not None and self.mixture is None else ""


@dataclass(frozen=True)
class Resolved:
    """A request's `model`, resolved for its caller: how the request named it and what serves it."""

    ref: ModelRef | None  # None: the base model, or a mixture
    served: ServedModel

    @property
    def kind(self) -> str:
        """base, name (an adapter's `stable` alias), version (NAME@V), alias (NAME:ALIAS) or mixture."""
        if self.served.mixture is not None:
            return "mixture"
        if self.ref is None:
            return "base"
        if self.ref.version is not None:
            return "version"
        return "alias" if self.ref.alias is not None else "name"

    @property
    def follows_rollouts(self) -> bool:
        """Only a bare NAME takes part in its name's rollout; a version or an alias pins what serves."""
        return self.kind == "name"


class ModelResolver:
    def __init__(self, base_model_id: str, registry: Registry, mixtures: Mixtures | None = None):
        self.base_model_id = base_model_id
        self.registry = registry
        self.mixtures = mixtures  # None: mixtures are refused

    def resolve(self, model: str, may_use: Visibility = everything) -> Resolved:
        """The base model or one adapter version. Raises the same 404 for an adapter that does not exist and for
        one the caller may not use."""
        if model == self.base_model_id:
            if not may_use(None):
                raise model_not_found(model)
            return Resolved(None, ServedModel(self.base_model_id, None))
        try:
            ref = parse_model_ref(model)
        except ValueError as e:
            raise model_not_found(model) from e
        if not may_use(ref.name) or ref.name.startswith(MIXTURE_PREFIX):
            raise model_not_found(model)
        try:
            manifest = self.registry.resolve(ref)
        except AdapterNotFound as e:
            raise model_not_found(model) from e
        return Resolved(ref, ServedModel(self.base_model_id, manifest))

    async def resolve_request(self, model: str, may_use: Visibility, tenant: TenantConfig) -> Resolved:
        """As `resolve`, and a mixture of adapters for a tenant allowed them (built on its first use)."""
        if model == self.base_model_id or not is_mixture(model):
            return self.resolve(model, may_use)
        if self.mixtures is None or not tenant.mixtures:
            raise OpenAIError(403, "This tenant may not call mixtures of adapters.", param="model",
                              code="mixtures_not_allowed")
        try:
            parts = parse_mixture(model)
        except ValueError as e:
            raise OpenAIError(400, f"Malformed mixture {model!r}: {e}.", param="model", code="invalid_mixture") from e
        resolved = [(self.resolve(str(part.ref), may_use).served.manifest, part.weight) for part in parts]
        mixture = await self.mixtures.manifest(resolved, tenant.name)
        return Resolved(None, ServedModel(self.base_model_id, mixture, canonical(resolved)))
