"""A request's `model` to what serves it: the base model or one adapter version, for this caller.

The registry is read on every request, so adapters published, promoted or rolled back while the server
runs are seen by the next request; a request keeps the version it resolved to until it ends. The string is
parsed once here (`adapters.identity.parse_model_ref`) and the result passed down whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adapters.identity import AdapterIdentity, ModelRef, parse_model_ref
from adapters.manifest import Manifest
from adapters.registry import AdapterNotFound, Registry
from api.auth import Caller
from api.errors import model_not_found
from api.tenancy.config import TenancyConfig

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

    @property
    def identity(self) -> AdapterIdentity | None:
        return self.manifest.identity if self.manifest is not None else None

    @property
    def id(self) -> str:
        return self.manifest.label if self.manifest is not None else self.base_model_id

    @property
    def name(self) -> str:
        return self.manifest.name if self.manifest is not None else self.base_model_id

    @property
    def version(self) -> str:
        """The adapter version, "" for the base model (as metrics and the ledger label it)."""
        return str(self.manifest.version) if self.manifest is not None else ""


@dataclass(frozen=True)
class Resolved:
    """A request's `model`, resolved for its caller: how the request named it and what serves it."""

    ref: ModelRef | None  # None: the base model
    served: ServedModel

    @property
    def kind(self) -> str:
        """base, name (an adapter's `stable` alias), version (NAME@V) or alias (NAME:ALIAS)."""
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
    def __init__(self, base_model_id: str, registry: Registry):
        self.base_model_id = base_model_id
        self.registry = registry

    def resolve(self, model: str, may_use: Visibility = everything) -> Resolved:
        """Raises the same 404 for an adapter that does not exist and for one the caller may not use."""
        if model == self.base_model_id:
            if not may_use(None):
                raise model_not_found(model)
            return Resolved(None, ServedModel(self.base_model_id, None))
        try:
            ref = parse_model_ref(model)
        except ValueError as e:
            raise model_not_found(model) from e
        if not may_use(ref.name):
            raise model_not_found(model)
        try:
            manifest = self.registry.resolve(ref)
        except AdapterNotFound as e:
            raise model_not_found(model) from e
        return Resolved(ref, ServedModel(self.base_model_id, manifest))
