"""GET /v1/models: the base model, the adapters and the virtual models a caller may use, as OpenAI model cards.
A virtual model is listed for a caller allowed to use every model it runs."""

from __future__ import annotations

import time
from datetime import datetime

from adapters.identity import MIXTURE_PREFIX, STABLE, version_label
from api.generation.resolve import ModelResolver, Visibility, everything
from api.generation.virtual_model_table import VirtualModelTable
from api.openai.protocol import ModelCard, ModelList


class ModelCatalog:
    def __init__(self, resolver: ModelResolver, virtual: VirtualModelTable | None = None):
        self.resolver = resolver
        self.virtual = virtual
        self._created = int(time.time())

    def model_list(self, may_use: Visibility = everything) -> ModelList:
        base_id = self.resolver.base_model_id
        cards = []
        if may_use(None):
            cards.append(ModelCard(id=base_id, created=self._created, root=base_id))
        for summary in self.resolver.registry.list():
            if not may_use(summary.name) or not summary.versions or summary.name.startswith(MIXTURE_PREFIX):
                continue
            stable = summary.aliases.get(STABLE, summary.versions[-1].version)
            newest = summary.versions[-1]
            cards.append(ModelCard(
                id=summary.name, created=_unix(newest.created_at), root=version_label(summary.name, stable),
                parent=base_id, versions=[m.version for m in summary.versions], aliases=dict(summary.aliases),
            ))
        return ModelList(data=cards + self._virtual_cards(may_use))

    def _virtual_cards(self, may_use: Visibility, only: str | None = None) -> list[ModelCard]:
        if self.virtual is None:
            return []
        return [ModelCard(id=name, created=self._created, root=name, kind=model.kind, members=list(model.members))
                for name, model in sorted(self.virtual.snapshot().items())
                if (only is None or name == only) and self.virtual.usable(name, may_use)]

    def model_card(self, model: str, may_use: Visibility = everything) -> ModelCard:
        virtual = self._virtual_cards(may_use, only=model)
        if virtual:
            return virtual[0]
        served = self.resolver.resolve(model, may_use).served
        if served.manifest is None:
            return ModelCard(id=served.id, created=self._created, root=served.id)
        return ModelCard(id=served.id, created=_unix(served.manifest.created_at), root=served.id,
                         parent=served.base_model_id, versions=[served.manifest.version])


def _unix(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
