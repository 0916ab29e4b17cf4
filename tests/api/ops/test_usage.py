"""GET /v1/usage parameters: time formats and who may see what."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from api.auth import Caller
from api.errors import OpenAIError
from api.ops.usage import parse_time, usage_filters, usage_limit

NOW = 1_764_700_000.0


def _utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("value, expected", [
    ("1764600000", 1_764_600_000.0),
    ("1764600000.5", 1_764_600_000.5),
    ("30s", NOW - 30),
    ("90m", NOW - 5400),
    ("1.5h", NOW - 5400),
    ("24h", NOW - 86400),
    ("7d", NOW - 7 * 86400),
    ("2w", NOW - 14 * 86400),
    ("2025-12-01", 1_764_547_200.0),
    ("2025-12-01T00:00:00Z", 1_764_547_200.0),
    ("2025-12-01T00:00:00", 1_764_547_200.0),
    ("2025-12-01T01:00:00+01:00", 1_764_547_200.0),
    ("2025-03-01T06:30:00", _utc(2025, 3, 1, 6, 30)),
])
def test_parse_time(value, expected):
    assert parse_time(value, now=NOW) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["yesterday", "5y", "", "-3h", "h", "-1d", "2025-13-01", "nan", "inf",
                                   "²", "99999999999999999999d", "99999999999999999999"])
def test_parse_time_refuses(value):
    with pytest.raises(ValueError):
        parse_time(value, now=NOW)


@pytest.mark.parametrize("value", ["yesterday", "99999999999999999999d"])
def test_bad_query_time_is_400_naming_the_parameter(value):
    with pytest.raises(OpenAIError) as info:
        usage_filters({"since": value}, Caller("acme"), now=NOW)
    assert info.value.status == 400 and info.value.param == "since"


@pytest.mark.parametrize("raw", ["-1", "10001", "²", "1.5", "x"])
def test_usage_limit_refuses(raw):
    with pytest.raises(OpenAIError) as info:
        usage_limit(raw)
    assert info.value.status == 400 and info.value.param == "limit"


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
