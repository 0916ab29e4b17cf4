"""The server's virtual models: checked against the registry at start and on reload, swapped whole."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from adapters.identity import parse_model_ref
from adapters.registry import AdapterNotFound, Registry
from api.generation.resolve import Visibility
from api.tenancy.virtual_models import VirtualModel, graph_problems, leaves


class GraphError(Exception):
    """Every problem of a set of virtual models, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class VirtualModelTable:
    def __init__(self, base_model_id: str, registry: Registry, models: Mapping[str, VirtualModel] | None = None):
        self.base_model_id = base_model_id
        self.registry = registry
        self._lock = threading.Lock()
        self._models: dict[str, VirtualModel] = {}
        self.replace(models or {})

    def problems(self, models: Mapping[str, VirtualModel]) -> list[str]:
        names = {summary.name for summary in self.registry.list() if summary.versions}

        def member_exists(ref: str) -> bool:
            try:
                self.registry.resolve(parse_model_ref(ref))
            except (AdapterNotFound, ValueError):
                return False
            return True

        return graph_problems(models, self.base_model_id, names.__contains__, member_exists)

    def replace(self, models: Mapping[str, VirtualModel]) -> None:
        """Raises GraphError (and keeps the current set) when the new set has any problem."""
        problems = self.problems(models)
        if problems:
            raise GraphError(problems)
        with self._lock:
            self._models = dict(models)

    def snapshot(self) -> dict[str, VirtualModel]:
        with self._lock:
            return dict(self._models)

    def get(self, name: str) -> VirtualModel | None:
        with self._lock:
            return self._models.get(name)

    def usable(self, name: str, may_use: Visibility) -> bool:
        """A caller may use a virtual model when it may use every model it runs."""
        models = self.snapshot()
        return all(may_use(None if leaf == self.base_model_id else parse_model_ref(leaf).name)
                   for leaf in leaves(models, name))
