"""Which models a caller may use: the base model and the registry's adapters, resolved per request.

The registry is read on every request, so adapters published, promoted or rolled back while the server
runs are seen by the next request; a request keeps the version it resolved to until it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from adapters.manifest import Manifest
from adapters.registry import AdapterNotFound, Registry, parse_model_ref
from api.errors import model_not_found
from api.protocol import ModelCard, ModelList

# Whether a caller may use an adapter name (None: the base model).
Visibility = Callable[[str | None], bool]


def everything(name: str | None) -> bool:
    return True


@dataclass(frozen=True)
class ServedModel:
    """What a request's `model` resolved to; `id` names the exact version that serves."""

    id: str
    name: str
    version: str  # "" for the base model
    manifest: Manifest | None


class ModelCatalog:
    def __init__(self, base_model_id: str, registry: Registry):
        self.base_model_id = base_model_id
        self.registry = registry
        self._created = int(time.time())

    def resolve(self, model: str, may_use: Visibility = everything) -> ServedModel:
        """Raises the same 404 for an adapter that does not exist and for one the caller may not use."""
        if model == self.base_model_id:
            if not may_use(None):
                raise model_not_found(model)
            return ServedModel(id=model, name=model, version="", manifest=None)
        try:
            ref = parse_model_ref(model)
        except ValueError as e:
            raise model_not_found(model) from e
        if not may_use(ref.name):
            raise model_not_found(model)
        try:
            manifest = self.registry.resolve(model)
        except AdapterNotFound as e:
            raise model_not_found(model) from e
        return ServedModel(id=f"{manifest.name}@{manifest.version}", name=manifest.name,
                           version=str(manifest.version), manifest=manifest)

    def model_list(self, may_use: Visibility = everything) -> ModelList:
        cards = []
        if may_use(None):
            cards.append(ModelCard(id=self.base_model_id, created=self._created, root=self.base_model_id))
        for summary in self.registry.list():
            if not may_use(summary.name) or not summary.versions:
                continue
            stable = summary.aliases.get("stable", summary.versions[-1].version)
            newest = summary.versions[-1]
            cards.append(ModelCard(
                id=summary.name, created=_unix(newest.created_at), root=f"{summary.name}@{stable}",
                parent=self.base_model_id, versions=[m.version for m in summary.versions],
                aliases=dict(summary.aliases),
            ))
        return ModelList(data=cards)

    def model_card(self, model: str, may_use: Visibility = everything) -> ModelCard:
        served = self.resolve(model, may_use)
        if served.manifest is None:
            return ModelCard(id=served.id, created=self._created, root=served.id)
        return ModelCard(id=served.id, created=_unix(served.manifest.created_at), root=served.id,
                         parent=self.base_model_id, versions=[served.manifest.version])


def _unix(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
