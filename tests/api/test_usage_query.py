"""GET /v1/usage parameters: time formats and who may see what."""

from __future__ import annotations

import pytest

from api.errors import OpenAIError
from api.gate import Caller
from api.usage_query import parse_time, usage_filters

NOW = 1_764_700_000.0


@pytest.mark.parametrize("value, expected", [
    ("1764600000", 1_764_600_000.0),
    ("90m", NOW - 5400),
    ("24h", NOW - 86400),
    ("7d", NOW - 7 * 86400),
    ("2025-12-01T00:00:00Z", 1_764_547_200.0),
    ("2025-12-01T00:00:00", 1_764_547_200.0),
    ("2025-12-01T01:00:00+01:00", 1_764_547_200.0),
])
def test_parse_time(value, expected):
    assert parse_time(value, "since", now=NOW) == expected


@pytest.mark.parametrize("value", ["yesterday", "5y", "", "-3h"])
def test_parse_time_refuses(value):
    with pytest.raises(OpenAIError) as info:
        parse_time(value, "since", now=NOW)
    assert info.value.status == 400 and info.value.param == "since"


@pytest.mark.parametrize("caller, params, tenant", [
    (Caller("acme"), {}, "acme"),
    (Caller("acme"), {"tenant": "acme"}, "acme"),
    (Caller("", is_admin=True), {}, None),
    (Caller("", is_admin=True), {"tenant": "globex"}, "globex"),
])
def test_tenant_scope(caller, params, tenant):
    assert usage_filters(params, caller, now=NOW)["tenant"] == tenant


def test_a_tenant_cannot_read_another():
    with pytest.raises(OpenAIError) as info:
        usage_filters({"tenant": "globex"}, Caller("acme"), now=NOW)
    assert info.value.status == 403


def test_unknown_parameter_is_named():
    with pytest.raises(OpenAIError) as info:
        usage_filters({"tenantt": "x"}, Caller("acme"), now=NOW)
    assert info.value.status == 400 and info.value.param == "tenantt"
