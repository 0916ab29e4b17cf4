"""Which models this server answers to: the base model and its adapters."""

from __future__ import annotations

import time
from dataclasses import dataclass

from adapters.local import LocalAdapter
from api.errors import model_not_found
from api.protocol import ModelCard, ModelList


@dataclass(frozen=True)
class ServedModel:
    """What a request's `model` resolved to; `id` is what responses name as having served."""

    id: str
    adapter: LocalAdapter | None


class ModelCatalog:
    def __init__(self, base_model_id: str, adapters: dict[str, LocalAdapter]):
        if base_model_id in adapters:
            raise ValueError(f"adapter name {base_model_id!r} collides with the base model id")
        self.base_model_id = base_model_id
        self._adapters = dict(adapters)
        self._created = int(time.time())

    def resolve(self, model: str) -> ServedModel:
        if model == self.base_model_id:
            return ServedModel(id=model, adapter=None)
        adapter = self._adapters.get(model)
        if adapter is None:
            raise model_not_found(model)
        return ServedModel(id=adapter.name, adapter=adapter)

    def model_list(self) -> ModelList:
        base = ModelCard(id=self.base_model_id, created=self._created, root=self.base_model_id)
        cards = [
            ModelCard(id=a.name, created=self._created, root=a.key, parent=self.base_model_id)
            for a in sorted(self._adapters.values(), key=lambda a: a.name)
        ]
        return ModelList(data=[base, *cards])
