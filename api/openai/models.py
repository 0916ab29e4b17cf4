"""GET /v1/models: the base model and the adapters a caller may use, as OpenAI model cards."""

from __future__ import annotations

import time
from datetime import datetime

from adapters.identity import STABLE, version_label
from api.generation.resolve import ModelResolver, Visibility, everything
from api.openai.protocol import ModelCard, ModelList


class ModelCatalog:
    def __init__(self, resolver: ModelResolver):
        self.resolver = resolver
        self._created = int(time.time())

    def model_list(self, may_use: Visibility = everything) -> ModelList:
        base_id = self.resolver.base_model_id
        cards = []
        if may_use(None):
            cards.append(ModelCard(id=base_id, created=self._created, root=base_id))
        for summary in self.resolver.registry.list():
            if not may_use(summary.name) or not summary.versions:
                continue
            stable = summary.aliases.get(STABLE, summary.versions[-1].version)
            newest = summary.versions[-1]
            cards.append(ModelCard(
                id=summary.name, created=_unix(newest.created_at), root=version_label(summary.name, stable),
                parent=base_id, versions=[m.version for m in summary.versions], aliases=dict(summary.aliases),
            ))
        return ModelList(data=cards)

    def model_card(self, model: str, may_use: Visibility = everything) -> ModelCard:
        served = self.resolver.resolve(model, may_use)
        if served.manifest is None:
            return ModelCard(id=served.id, created=self._created, root=served.id)
        return ModelCard(id=served.id, created=_unix(served.manifest.created_at), root=served.id,
                         parent=served.base_model_id, versions=[served.manifest.version])


def _unix(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
