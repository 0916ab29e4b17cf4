from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.cluster.config import ClusterConfig


def test_off_by_default():
    assert not ClusterConfig().enabled
    assert ClusterConfig(replicas=2).enabled


@pytest.mark.parametrize(("values", "problem"), [
    ({"replicas": 0}, "replicas must be >= 1 without autoscaling"),
    ({"ray_address": "127.0.0.1:6379"}, "need --replicas"),
    ({"replicas": 2, "attach": True}, "--attach needs --ray-address"),
    ({"autoscale": True}, "need --replicas"),
    ({"replicas": 1, "autoscale": True, "min_replicas": 3, "max_replicas": 2}, "min_replicas (3) must be <="),
    ({"replicas": 5, "autoscale": True, "min_replicas": 1, "max_replicas": 4}, "must lie in [min_replicas"),
    ({"replicas": 2, "adapter_replicas": {"poet": 3}}, "poet asks for 3 replicas; there are at most 2"),
    ({"replicas": 1, "autoscale": True, "max_replicas": 2, "adapter_replicas": {"poet": 3}}, "at most 2"),
    ({"replicas": 2, "adapter_replicas": {"poet": 0}}, "poet asks for 0 replicas; at least 1"),
    ({"adapter_replicas": {"poet": 1}}, "--adapter-replicas needs --replicas"),
])
def test_cross_field_problems(values, problem):
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ClusterConfig(**values)


def test_scale_to_zero_is_allowed_when_autoscaling():
    config = ClusterConfig(replicas=0, autoscale=True, min_replicas=0, max_replicas=2)
    assert config.enabled and config.min_replicas == 0


@pytest.mark.parametrize(("fields", "nodes", "cap"), [
    ({"replicas": 2}, 2, 1),  # one per node: never both on one host while the other has room
    ({"replicas": 2}, 1, 2),  # one node: both there
    ({"replicas": 3}, 2, 2),
    ({"replicas": 4}, 0, 4),  # no node seen yet: no tighter cap than the replicas themselves
    ({"replicas": 1, "autoscale": True, "max_replicas": 6}, 4, 2),  # sized for the most there may be
    ({"replicas": 2, "max_replicas_per_node": 3}, 2, 3),  # set: used as is
    ({"replicas": 2, "max_replicas_per_node": 0}, 2, None),  # 0: no cap
])
def test_replicas_per_node_cap(fields, nodes, cap):
    assert ClusterConfig(**fields).per_node_cap(nodes) == cap
