from __future__ import annotations

import time

import pytest
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from engine.cluster.autoscale import (
    AdapterQueue,
    AdapterQueuePolicy,
    adapter_queues,
    autoscaling_stats,
    replicas_for_queues,
)
from engine.cluster.config import ClusterConfig
from engine.cluster.deploy import _autoscaling


@pytest.mark.parametrize(("waiting", "resident", "stats"), [
    ({}, [], {}),
    ({}, ["poet", "legal"], {"waiting:poet": 0.0, "waiting:legal": 0.0}),
    ({"poet": 3}, ["poet", "legal"], {"waiting:poet": 3.0, "waiting:legal": 0.0}),
    ({"chef": 2}, ["poet"], {"waiting:poet": 0.0, "waiting:chef": 2.0}),  # waiting, not yet resident
])
def test_a_replica_reports_what_waits_for_each_adapter_it_holds(waiting, resident, stats):
    assert autoscaling_stats(waiting, resident) == stats


def test_queues_sum_over_replicas_and_count_holders():
    metrics = {"waiting:poet": {"r1": 3.0, "r2": 1.5}, "waiting:legal": {"r1": 0.0},
               "running_requests": {"r1": 9.0, "r2": 9.0}, "waiting:gone": {}}
    assert adapter_queues(metrics) == {"poet": AdapterQueue(4.5, 2), "legal": AdapterQueue(0.0, 1)}


@pytest.mark.parametrize(("current", "queues", "target", "wanted"), [
    (1, {}, 4, 0),  # no opinion: Ray's count decides
    (1, {"poet": AdapterQueue(4.0, 1)}, 4, 0),  # at target
    (1, {"poet": AdapterQueue(4.5, 1)}, 4, 2),
    (1, {"poet": AdapterQueue(9.0, 1)}, 4, 3),
    (2, {"poet": AdapterQueue(9.0, 2)}, 4, 3),  # both replicas hold it: one more
    (3, {"poet": AdapterQueue(2.0, 1), "chef": AdapterQueue(0.0, 3)}, 4, 0),
    (2, {"poet": AdapterQueue(5.0, 1), "chef": AdapterQueue(13.0, 2)}, 4, 4),  # the most starved adapter decides
    (2, {"poet": AdapterQueue(1.0, 1)}, 0.5, 3),
])
def test_replicas_for_queues(current, queues, target, wanted):
    assert replicas_for_queues(current, queues, target) == wanted


def _context(replicas: int, ongoing: float, metrics: dict, target_ongoing: float = 16.0) -> AutoscalingContext:
    config = AutoscalingConfig(min_replicas=0, max_replicas=8, target_ongoing_requests=target_ongoing)
    ids = [f"r{i}" for i in range(replicas)]
    return AutoscalingContext(
        deployment_id=None, deployment_name="engine", app_name="loraplex", current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=ids, total_num_requests=ongoing, total_queued_requests=0.0,
        aggregated_metrics=metrics, raw_metrics={}, capacity_adjusted_min_replicas=0,
        capacity_adjusted_max_replicas=8, policy_state={}, last_scale_up_time=None, last_scale_down_time=None,
        current_time=time.time(), config=config)


@pytest.mark.parametrize(("replicas", "ongoing", "metrics", "wanted"), [
    (2, 16.0, {}, 1.0),  # Ray's rule alone: 16 ongoing at 16 per replica
    (2, 16.0, {"waiting:poet": {"r0": 4.0, "r1": 4.0}}, 1.0),  # queues at target: scales down all the same
    (2, 64.0, {"waiting:poet": {"r0": 1.0}}, 4.0),  # Ray's rule is the larger
    (2, 8.0, {"waiting:poet": {"r0": 9.0}}, 4),  # few requests, but 9 wait for poet on its one holder
    (0, 0.0, {"waiting:poet": {}}, 0),  # scaled to zero and idle: stays there
    (0, 1.0, {}, 1),  # scaled to zero: the first request wakes one
])
def test_the_policy_takes_the_larger_of_ongoing_and_adapter_queues(replicas, ongoing, metrics, wanted):
    desired, _ = AdapterQueuePolicy(target_adapter_waiting=4.0)(_context(replicas, ongoing, metrics))
    assert desired == wanted


def test_the_deployment_autoscales_with_the_policy_and_the_configured_target():
    config = _autoscaling(ClusterConfig(replicas=1, autoscale=True, target_adapter_waiting=2.5))
    config.policy.serialize_policy()  # what Serve does before sending the config to its controller
    policy = config.policy.get_policy()(**config.policy.policy_kwargs)
    assert isinstance(policy, AdapterQueuePolicy) and policy.target_adapter_waiting == 2.5
