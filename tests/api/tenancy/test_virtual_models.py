import pytest
from pydantic import ValidationError

from api.tenancy.virtual_models import VirtualModel, find_cycles, graph_problems, leaves

ADAPTERS = {"sql-helper": (1, 2), "poet": (1,)}


def adapter_exists(name: str) -> bool:
    return name in ADAPTERS


def member_exists(ref: str) -> bool:
    name, _, version = ref.partition("@")
    name = name.partition(":")[0]
    return name in ADAPTERS and (not version or int(version) in ADAPTERS[name])


def cascade(*stages, **rule):
    return VirtualModel.model_validate({"cascade": {"stages": list(stages),
                                                    "escalate_when": rule or {"mean_logprob_below": -1}}})


def ensemble(*members):
    return VirtualModel.model_validate({"ensemble": {"members": list(members)}})


@pytest.mark.parametrize("data, message", [
    ({}, "exactly one of cascade or ensemble"),
    ({"cascade": {"stages": ["a", "b"], "escalate_when": {"mean_logprob_below": -1}},
      "ensemble": {"members": ["a", "b"]}}, "exactly one of cascade or ensemble"),
    ({"cascade": {"stages": ["a"], "escalate_when": {"mean_logprob_below": -1}}}, "at least 2"),
    ({"cascade": {"stages": ["a", "b"], "escalate_when": {}}}, "set mean_logprob_below, output_matches"),
    ({"cascade": {"stages": ["a", "b"], "escalate_when": {"output_matches": "("}}}, "not a valid regular"),
    ({"ensemble": {"members": ["a", "b"], "aggregate": "mean"}}, "majority"),
    ({"ensemble": {"members": ["a", " b"]}}, "surrounding spaces"),
    ({"ensemble": {"members": ["a", "b"]}, "weights": [1, 2]}, "Extra inputs"),
])
def test_schema_refuses(data, message):
    with pytest.raises(ValidationError, match=message):
        VirtualModel.model_validate(data)


def test_a_valid_graph_has_no_problem():
    models = {"triage": cascade("sql-helper", "poet@1"), "vote": ensemble("triage", "poet", "base", "sql-helper:stable")}
    assert graph_problems(models, "base", adapter_exists, member_exists) == []


def test_every_problem_at_once():
    models = {
        "poet": ensemble("sql-helper", "sql-helper"),  # clashes with an adapter
        "base": ensemble("sql-helper", "poet"),  # clashes with the base model
        "a": cascade("missing", "sql-helper@9"),  # unknown adapter, unknown version
        "b": ensemble("c", "Bad Name"),
        "c": ensemble("b", "poet"),  # b -> c -> b
    }
    problems = graph_problems(models, "base", adapter_exists, member_exists)
    assert problems == [
        "virtual_models.poet: the name clashes with an adapter 'poet'; callers could not tell them apart",
        "virtual_models.base: the name clashes with the base model 'base'; callers could not tell them apart",
        "virtual_models.a.cascade[0]: unknown member 'missing' (not an adapter, the base model or a virtual model)",
        ("virtual_models.a.cascade[1]: unknown member 'sql-helper@9' (not an adapter, the base model or a virtual "
         "model)"),
        "virtual_models.b.ensemble[1]: adapter name 'Bad Name' must match ^[a-z0-9][a-z0-9._-]{0,62}$",
        "virtual_models: cycle b -> c -> b",
    ]


@pytest.mark.parametrize("graph, expected", [
    ({"a": ["x", "y"]}, []),
    ({"a": ["a", "x"]}, [["a", "a"]]),
    ({"a": ["b", "x"], "b": ["c", "x"], "c": ["a", "x"]}, [["a", "b", "c", "a"]]),
    ({"a": ["b", "c"], "b": ["x", "y"], "c": ["b", "x"]}, []),  # a diamond is no cycle
    ({"a": ["b", "x"], "b": ["a", "c"], "c": ["b", "x"]}, [["a", "b", "a"], ["b", "c", "b"]]),
])
def test_find_cycles(graph, expected):
    assert find_cycles({name: ensemble(*members) for name, members in graph.items()}) == expected


def test_leaves_through_nested_models():
    models = {"outer": ensemble("inner", "poet", "sql-helper"), "inner": cascade("sql-helper", "base")}
    assert leaves(models, "outer") == ["sql-helper", "base", "poet"]
