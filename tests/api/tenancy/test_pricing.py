from __future__ import annotations

import pytest

from api.tenancy.config import TenancyConfig, parse_tenancy_config
from api.tenancy.pricing import ComputeMeter, PriceTable, Rates


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable(parse_tenancy_config({
        "pricing": {"default": {"prompt": 0.5, "completion": 1.5},
                    "models": {"base": {"prompt": 0.2, "completion": 0.6},
                               "sql-helper": {"prompt": 1.0, "completion": 3.0}}},
        "tenants": [
            {"name": "plain"},
            {"name": "discount", "pricing": {"default": {"prompt": 0.1, "completion": 0.3},
                                             "models": {"sql-helper": {"prompt": 0.8, "completion": 2.4}}}},
            {"name": "per-model", "pricing": {"models": {"base": {"prompt": 0.0, "completion": 0.0}}}},
        ],
    }))


@pytest.mark.parametrize(("tenant", "model", "rates"), [
    ("plain", "base", Rates(0.2, 0.6)),  # server model price
    ("plain", "support-bot", Rates(0.5, 1.5)),  # server default
    ("discount", "sql-helper", Rates(0.8, 2.4)),  # tenant model price
    ("discount", "base", Rates(0.1, 0.3)),  # tenant default beats the server's model price
    ("per-model", "base", Rates(0.0, 0.0)),  # tenant model price, even when free
    ("per-model", "sql-helper", Rates(1.0, 3.0)),  # no tenant default: server model price
    ("per-model", "other", Rates(0.5, 1.5)),
    ("unknown-tenant", "sql-helper", Rates(1.0, 3.0)),
])
def test_rate_precedence(table, tenant, model, rates):
    assert table.rates(tenant, model) == rates


@pytest.mark.parametrize(("tenant", "model", "prompt", "completion", "usd"), [
    ("plain", "base", 1_000_000, 0, 0.2),
    ("plain", "base", 0, 1_000_000, 0.6),
    ("discount", "sql-helper", 1000, 500, (1000 * 0.8 + 500 * 2.4) / 1e6),
    ("plain", "anything", 0, 0, 0.0),
])
def test_price(table, tenant, model, prompt, completion, usd):
    assert table.price(tenant, model, prompt, completion) == pytest.approx(usd)


@pytest.mark.parametrize(("server", "tenant", "discount"), [
    (None, None, 0.5),  # OpenAI's batch discount
    (0.2, None, 0.2),
    (0.2, 0.0, 0.0),  # the tenant's, even none
    (None, 0.75, 0.75),
])
def test_batch_discount_precedence(server, tenant, discount):
    pricing = {} if server is None else {"batch_discount": server}
    override = {} if tenant is None else {"pricing": {"batch_discount": tenant}}
    table = PriceTable(parse_tenancy_config({"pricing": pricing, "tenants": [{"name": "t", **override}]}))
    assert table.batch_discount("t") == discount


def test_without_prices_everything_is_free():
    table = PriceTable(TenancyConfig.open_default())
    assert table.rates("default", "m") == Rates(0.0, 0.0)
    assert table.price("default", "m", 10**6, 10**6) == 0.0


COST_PER_HOUR = 3600.0  # one dollar per second keeps the arithmetic readable


@pytest.mark.parametrize(("steps", "total", "per_token"), [
    # (now, tokens_in_step, busy) fed in order
    ([], 0.0, 0.0),
    ([(0.0, 10, True)], 0.0, 0.0),  # the first step has no previous one to measure from
    ([(0.0, 0, True), (0.5, 100, True)], 0.5, 0.005),
    ([(0.0, 0, True), (0.5, 100, True), (1.0, 50, True)], 1.0, 0.005 + 0.5 * (0.01 - 0.005)),
    ([(0.0, 0, False), (30.0, 0, False), (30.2, 20, True)], 0.2, 0.01),  # idle time is free
    ([(0.0, 0, True), (5.0, 100, True)], 1.0, 0.01),  # a long gap is clamped
    ([(0.0, 0, True), (0.4, 0, True), (0.8, 40, True)], 0.8, 0.01),  # a busy step without tokens costs
    ([(0.0, 0, True), (0.5, 100, False)], 0.0, 0.0),
])
def test_compute_meter(steps, total, per_token):
    meter = ComputeMeter(COST_PER_HOUR, max_step_s=1.0, smoothing=0.5)
    for now, tokens, busy in steps:
        meter.on_step(now, tokens, busy)
    assert meter.total_cost_usd == pytest.approx(total)
    assert meter.usd_per_token == pytest.approx(per_token)
    assert meter.charge(200) == pytest.approx(200 * per_token)


def test_compute_meter_cost_matches_machine_cost_when_busy_all_hour():
    meter = ComputeMeter(1.20)
    for i in range(3601):
        meter.on_step(i * 1.0, 10, True)
    assert meter.total_cost_usd == pytest.approx(1.20)
    assert meter.usd_per_token == pytest.approx(1.20 / 3600 / 10)


@pytest.mark.parametrize("kwargs", [{"cost_per_hour": -1}, {"cost_per_hour": 1, "max_step_s": 0},
                                    {"cost_per_hour": 1, "smoothing": 0}, {"cost_per_hour": 1, "smoothing": 1.5}])
def test_compute_meter_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        ComputeMeter(**kwargs)
