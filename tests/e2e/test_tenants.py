"""Tenants on the real server: keys, visibility, limits with their headers, usage isolation, abort billing.
(Every limit's exact counting and recovery is table-tested on the limiter with a fake clock.)"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import ledger_rows
from tests.engine_gate import EngineGate, StreamReader, wait_until

OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}


def _complete(server, headers, model, max_tokens: int | None = 4, **extra):
    body = {"model": model, "prompt": "hello", "ignore_eos": True, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return httpx.post(f"{server}/v1/completions", headers=headers, timeout=120, json=body)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer lpx-wrong"}, {"Authorization": "Basic x"}])
def test_missing_or_wrong_key_is_401(server, base_model_id, headers):
    response = _complete(server, headers, base_model_id)
    assert response.status_code == 401
    assert set(response.json()["error"]) == OPENAI_ERROR_FIELDS
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server}/v1/models", headers=headers).status_code == 401


def test_other_tenants_adapter_does_not_exist(server, keys, base_model_id):
    globex = keys.headers("globex")
    hidden = _complete(server, globex, "sql-helper")
    missing = _complete(server, globex, "no-such-adapter")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"].replace("sql-helper", "X") == \
        missing.json()["error"]["message"].replace("no-such-adapter", "X")
    assert [m["id"] for m in httpx.get(f"{server}/v1/models", headers=globex).json()["data"]] == [base_model_id]
    assert httpx.get(f"{server}/v1/models/sql-helper", headers=globex).status_code == 404
    assert _complete(server, globex, base_model_id).status_code == 200


def test_requests_per_minute_and_max_tokens_cap(server, keys):
    tiny = keys.headers("tiny")
    over_cap = _complete(server, tiny, "sql-helper", max_tokens=17)
    assert over_cap.status_code == 400 and over_cap.json()["error"]["param"] == "max_tokens"
    window_opened = time.monotonic()  # no earlier than the first counted request
    statuses = [_complete(server, tiny, "sql-helper", max_tokens=m) for m in (None, 4, 4)]
    assert [r.status_code for r in statuses] == [200, 200, 200]
    assert statuses[0].json()["usage"]["completion_tokens"] == 16, "no max_tokens: the tenant's cap applies"
    assert statuses[-1].headers["x-ratelimit-limit-requests"] == "3"
    assert statuses[-1].headers["x-ratelimit-remaining-requests"] == "0"
    refused = _complete(server, tiny, "sql-helper")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "requests_per_minute" in refused.json()["error"]["message"]
    # The first counted request leaves the 60 s window no sooner than 60 s after `window_opened`.
    assert 60 - (time.monotonic() - window_opened) <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    usage = httpx.get(f"{server}/v1/usage", headers=tiny).json()
    assert {row["status"] for row in usage["data"]} == {200, 400, 429}
    assert all(row["tenant"] == "tiny" for row in usage["data"])


def test_tokens_per_minute_reserves_max_tokens(server, keys, base_model_id):
    tokmin = keys.headers("tokmin")
    assert _complete(server, tokmin, base_model_id, max_tokens=100).status_code == 200
    refused = _complete(server, tokmin, base_model_id, max_tokens=100)
    assert refused.status_code == 429 and "tokens_per_minute" in refused.json()["error"]["message"]
    assert refused.headers["x-ratelimit-limit-tokens"] == "120"


def test_usage_is_per_tenant(server, keys, acme, base_model_id):
    assert _complete(server, keys.headers("globex"), base_model_id).status_code == 200
    assert _complete(server, acme, base_model_id).status_code == 200
    own = httpx.get(f"{server}/v1/usage", headers=acme).json()
    assert own["data"] and {row["tenant"] for row in own["data"]} == {"acme"}
    assert httpx.get(f"{server}/v1/usage?tenant=globex", headers=acme).status_code == 403
    everyone = httpx.get(f"{server}/v1/usage?limit=10000", headers=keys.admin_headers).json()
    assert {"acme", "globex"} <= {row["tenant"] for row in everyone["summary"]}
    only_globex = httpx.get(f"{server}/v1/usage?tenant=globex", headers=keys.admin_headers).json()
    assert {row["tenant"] for row in only_globex["data"]} == {"globex"}


def test_aborted_stream_is_billed_for_tokens_sent(server, server_process, acme, keys):
    request_id = f"abort-{time.time_ns()}"
    body = {"model": "poet", "prompt": "a long story", "max_tokens": 1000, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    # The engine is held while the client goes, so it goes with nearly all 1000 tokens still to come.
    with EngineGate.of(server_process.proc.pid) as gate:
        stream = StreamReader(f"{server}/v1/completions", {**acme, "X-Request-Id": request_id}, body)
        gate.pulse_until(lambda: bool(stream.chunks))
        stream.drop()
        received = sum(len(chunk["choices"][0]["token_ids"]) for chunk in stream.chunks)

        wait_until(lambda: bool(ledger_rows(server, keys, request_id)), "a ledger row for the dropped stream")
    [row] = ledger_rows(server, keys, request_id)
    assert row["status"] == 499 and row["finish"] == "aborted"
    # Billed at least what the client received, and not for the 1000 it asked for.
    assert 1 <= received <= row["completion_tokens"] < 1000
    assert row["price_usd"] == pytest.approx((row["prompt_tokens"] * 1.0 + row["completion_tokens"] * 2.0) / 1e6)
