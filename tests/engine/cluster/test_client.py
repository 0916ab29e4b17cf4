from __future__ import annotations

import pytest

from engine.cluster.client import handle_options
from engine.cluster.config import ClusterConfig


@pytest.mark.parametrize(("fields", "by_reference"), [
    ({}, False),  # the default: Ray Serve's gRPC transport, no Ray task per request
    ({"hop_transport": "grpc"}, False),
    ({"hop_transport": "actor"}, True),
])
def test_handle_options(fields, by_reference):
    assert handle_options(ClusterConfig(replicas=1, **fields)) == {"stream": True, "_by_reference": by_reference}
