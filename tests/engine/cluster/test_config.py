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
])
def test_cross_field_problems(values, problem):
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ClusterConfig(**values)


def test_scale_to_zero_is_allowed_when_autoscaling():
    config = ClusterConfig(replicas=0, autoscale=True, min_replicas=0, max_replicas=2)
    assert config.enabled and config.min_replicas == 0
