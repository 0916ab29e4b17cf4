"""Virtual models: named graphs over adapters (a cascade of stages, or an ensemble of members), as configured
in the `virtual_models:` section of the tenants file.

    virtual_models:
      triage:                      # a name callers send as `model`
        cascade:
          stages: [sql-helper, poet]
          escalate_when: {mean_logprob_below: -2.5, output_matches: "(?i)not sure"}
      vote:
        ensemble:
          members: [sql-helper, poet, support-bot]
          aggregate: majority      # or max_mean_logprob

A member is an adapter reference (`NAME`, `NAME@VERSION`, `NAME:ALIAS`), the base model id, or another virtual
model. The schema is checked with the tenants file; `graph_problems` checks the graph against the registry
(unknown members, cycles, names that clash with adapters) and reports every problem at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from adapters.identity import parse_model_ref

VIRTUAL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
CASCADE, ENSEMBLE = "cascade", "ensemble"
MAJORITY, MAX_MEAN_LOGPROB = "majority", "max_mean_logprob"


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"not a valid regular expression: {e}") from e
    return value


def _check_ref(value: str) -> str:
    if not value or value != value.strip():
        raise ValueError(f"member {value!r} must be a non-empty name without surrounding spaces")
    return value


Regex = Annotated[str, AfterValidator(_check_regex)]
MemberRef = Annotated[str, AfterValidator(_check_ref)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EscalationRule(_Strict):
    """When a cascade stage's answer is handed on to the next stage; either condition escalates."""

    mean_logprob_below: float | None = Field(
        default=None, description="Escalate when the answer's mean token logprob is below this (an empty answer "
        "has no mean and never escalates by this condition).")
    output_matches: Regex | None = Field(
        default=None, description="Escalate when this regular expression matches the answer (re.search).")

    @model_validator(mode="after")
    def _one_condition(self):
        if self.mean_logprob_below is None and self.output_matches is None:
            raise ValueError("set mean_logprob_below, output_matches or both")
        return self


class CascadeConfig(_Strict):
    """Stages tried in order: the first whose answer does not escalate answers; the last always answers."""

    stages: list[MemberRef] = Field(min_length=2, description="Members tried in order.")
    escalate_when: EscalationRule = Field(description="The rule judged on every stage but the last.")


class EnsembleConfig(_Strict):
    """Every member answers the request; one answer is chosen."""

    members: list[MemberRef] = Field(min_length=2, description="Members that all answer the request.")
    aggregate: Literal["majority", "max_mean_logprob"] = Field(
        default=MAJORITY, description="majority: the most common answer after normalising case, spaces and "
        "surrounding punctuation (ties: the earliest member); max_mean_logprob: the answer with the highest "
        "mean token logprob.")


class VirtualModel(_Strict):
    """Exactly one of `cascade` or `ensemble`."""

    description: str = Field(default="", description="Shown to operators.")
    cascade: CascadeConfig | None = None
    ensemble: EnsembleConfig | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        if (self.cascade is None) == (self.ensemble is None):
            raise ValueError("set exactly one of cascade or ensemble")
        return self

    @property
    def kind(self) -> str:
        return CASCADE if self.cascade is not None else ENSEMBLE

    @property
    def members(self) -> list[str]:
        return self.cascade.stages if self.cascade is not None else self.ensemble.members


VirtualName = Annotated[str, Field(pattern=VIRTUAL_NAME_PATTERN)]
VirtualModels = dict[VirtualName, VirtualModel]


def graph_problems(models: Mapping[str, VirtualModel], base_model_id: str,
                   adapter_exists: Callable[[str], bool], member_exists: Callable[[str], bool]) -> list[str]:
    """Every problem of the graph at once. `adapter_exists(name)`: an adapter of that name is published;
    `member_exists(ref)`: an adapter reference resolves (its version or alias exists)."""
    problems = []
    for name, model in models.items():
        where = f"virtual_models.{name}"
        if name == base_model_id or adapter_exists(name):
            problems.append(f"{where}: the name clashes with {'the base model' if name == base_model_id else 'an adapter'}"
                            f" {name!r}; callers could not tell them apart")
        for i, member in enumerate(model.members):
            if member == base_model_id or member in models:
                continue
            try:
                parse_model_ref(member)
            except ValueError as e:
                problems.append(f"{where}.{model.kind}[{i}]: {e}")
                continue
            if not member_exists(member):
                problems.append(f"{where}.{model.kind}[{i}]: unknown member {member!r} (not an adapter, the base "
                                f"model or a virtual model)")
    for cycle in find_cycles(models):
        problems.append(f"virtual_models: cycle {' -> '.join(cycle)}")
    return problems


def find_cycles(models: Mapping[str, VirtualModel]) -> list[list[str]]:
    """Each cycle among virtual models once, as [a, b, ..., a], starting from its smallest name."""
    cycles: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for member in dict.fromkeys(models[path[-1]].members):
            if member not in models:
                continue
            if member in path:
                loop = path[path.index(member):]
                start = loop.index(min(loop))
                key = tuple(loop[start:] + loop[:start])
                if key not in seen:
                    seen.add(key)
                    cycles.append([*key, key[0]])
            else:
                walk([*path, member])

    for name in sorted(models):
        walk([name])
    return cycles


def leaves(models: Mapping[str, VirtualModel], name: str) -> list[str]:
    """The non-virtual members a virtual model runs, through nested virtual models, each once, in order.
    The graph must be acyclic (`graph_problems` found no cycle)."""
    found: dict[str, None] = {}
    for member in models[name].members:
        if member in models:
            found.update(dict.fromkeys(leaves(models, member)))
        else:
            found[member] = None
    return list(found)
