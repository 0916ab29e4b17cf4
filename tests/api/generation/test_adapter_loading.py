from __future__ import annotations

import pytest

from api.generation.adapter_loading import AdapterLoadFailed


@pytest.mark.parametrize(("invalid", "status", "code", "says"), [
    (True, 500, "adapter_invalid", "Adapter poet@2 failed validation: rank 128 > 64"),
    (False, 503, "adapter_load_failed", "Adapter poet@2 could not be loaded: rank 128 > 64"),
])
def test_a_load_failure_is_typed_and_becomes_one_http_error(invalid, status, code, says):
    failure = AdapterLoadFailed("poet@2", "rank 128 > 64", invalid=invalid)
    assert failure.status == status
    error = failure.http()
    assert (error.status, error.body()["error"]["code"], error.body()["error"]["message"]) == (status, code, says)
