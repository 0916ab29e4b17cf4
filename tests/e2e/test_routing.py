"""The routing step on the real server (real engine, real `openai` client): a canary's share, sticky A/B with
feedback and a report, a shadow that never answers, a candidate made to fail that falls back, opens its breaker
and is rolled back by itself. That this state survives a restart is checked in test_zz_lifecycle.py."""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest

CANARY_REQUESTS = 400
CANARY_PERCENT = 10


def binomial_bounds(n: int, p: float, confidence: float) -> tuple[int, int]:
    """The exact central interval [lo, hi] holding X ~ Binomial(n, p) with probability >= `confidence`."""
    pmf = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]
    tail = (1 - confidence) / 2
    lo, below = 0, 0.0
    while below + pmf[lo] <= tail:
        below += pmf[lo]
        lo += 1
    hi, above = n, 0.0
    while above + pmf[hi] <= tail:
        above += pmf[hi]
        hi -= 1
    return lo, hi


# By hand: Binomial(20, 0.5) has P(X <= 2) = 211 / 2^20 = 0.0002 and P(X <= 3) = 1351 / 2^20 = 0.0013.
@pytest.mark.parametrize(("n", "p", "bounds"), [(20, 0.5, (3, 17)), (10, 0.5, (0, 10))])
def test_binomial_bounds(n, p, bounds):
    assert binomial_bounds(n, p, 0.999) == bounds


@pytest.fixture(scope="module")
def admin(server, keys):
    client = httpx.Client(base_url=server, headers=keys.admin_headers, timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def publish(registry, adapter_dirs):
    """publish(name, *sources) -> versions: each demo adapter as the next version of `name`, stable at the first."""

    def run(name: str, *sources: str) -> list[int]:
        versions = [registry.push(adapter_dirs[source], name).version for source in sources]
        registry.promote(name, versions[0])
        return versions

    return run


def start(admin, name: str, **body) -> dict:
    response = admin.post(f"/v1/adapters/{name}/rollout", json=body)
    assert response.status_code == 201, response.text
    return response.json()


async def complete(client, model: str, max_tokens: int = 1, **kwargs):
    raw = await client.completions.with_raw_response.create(model=model, prompt="Hello there", max_tokens=max_tokens,
                                                           temperature=0, extra_body={"ignore_eos": True}, **kwargs)
    return raw.headers, raw.parse()


async def test_a_canary_takes_its_share_and_pins_still_pin(admin, publish, async_openai_client):
    publish("route-canary", "sql-helper", "support-bot")
    rollout = start(admin, "route-canary", candidate=2, percent=CANARY_PERCENT)
    gate = asyncio.Semaphore(32)

    async def one(model: str):
        async with gate:
            return await complete(async_openai_client, model)

    results = await asyncio.gather(*(one("route-canary") for _ in range(CANARY_REQUESTS)))
    served = [headers["x-loraplex-model"] for headers, _ in results]
    assert all(body.model == headers["x-loraplex-model"] for headers, body in results)
    for headers, _ in results:
        arm = "candidate" if headers["x-loraplex-model"] == "route-canary@2" else "stable"
        assert headers["x-loraplex-route"] == f"canary;arm={arm};rollout={rollout['id']}"
    lo, hi = binomial_bounds(CANARY_REQUESTS, CANARY_PERCENT / 100, 0.999)
    assert set(served) == {"route-canary@1", "route-canary@2"}
    assert lo <= served.count("route-canary@2") <= hi, served.count("route-canary@2")
    for pinned in ("route-canary@1", "route-canary@2"):
        headers, body = await complete(async_openai_client, pinned)
        assert body.model == pinned and headers["x-loraplex-route"] == "pinned"
    report = admin.get("/v1/adapters/route-canary/rollout").json()
    assert sum(arm["requests"] for arm in report["arms"]) == CANARY_REQUESTS
    assert admin.post("/v1/adapters/route-canary/rollout/abort").json()["state"] == "aborted"


async def test_sticky_ab_with_feedback_and_report(admin, publish, server, keys, async_openai_client):
    publish("route-ab", "sql-helper", "support-bot")
    start(admin, "route-ab", candidate=2, percent=50, sticky=True)
    seen: dict[str, set[str]] = {}
    request_ids: dict[str, str] = {}
    for user in (f"user-{i}" for i in range(16)):
        for j in range(3):
            request_id = f"ab-{user}-{j}-{time.time_ns()}"
            headers, body = await complete(async_openai_client, "route-ab", user=user,
                                           extra_headers={"X-Request-Id": request_id})
            seen.setdefault(user, set()).add(body.model)
            request_ids[request_id] = body.model
    assert all(len(models) == 1 for models in seen.values()), seen
    assert set().union(*seen.values()) == {"route-ab@1", "route-ab@2"}
    for request_id, model in request_ids.items():
        score = 1 if model == "route-ab@2" else 0
        response = httpx.post(f"{server}/v1/feedback", headers=keys.headers("acme"), timeout=30,
                              json={"request_id": request_id, "score": score})
        assert response.status_code == 200, response.text
    other = httpx.post(f"{server}/v1/feedback", headers=keys.headers("obs"), timeout=30,
                       json={"request_id": next(iter(request_ids)), "score": 1})
    assert other.status_code == 404  # another tenant's request
    report = admin.get("/v1/adapters/route-ab/rollout").json()
    arms = {arm["arm"]: arm for arm in report["arms"]}
    assert arms["stable"]["requests"] + arms["candidate"]["requests"] == 48
    assert arms["candidate"]["feedback_mean"] == 1.0 and arms["stable"]["feedback_mean"] == 0.0
    assert all(arm["ttft_s"]["p95"] is not None and arm["completion_tokens"] > 0 for arm in arms.values())
    verdicts = {c["metric"]: c["verdict"] for c in report["comparisons"]}
    assert verdicts["feedback"].startswith("not enough data")  # 48 requests split by user: < 30 per arm
    admin.post("/v1/adapters/route-ab/rollout/abort")


async def test_a_shadow_never_answers(admin, publish, async_openai_client, demo_home, metrics_text):
    from api.tenancy.ledger import UsageLedger

    publish("route-shadow", "sql-helper", "support-bot")
    rollout = start(admin, "route-shadow", candidate=2, percent=0, shadow_percent=100)
    _, stable_alone = await complete(async_openai_client, "route-shadow@1", max_tokens=8)
    _, candidate_alone = await complete(async_openai_client, "route-shadow@2", max_tokens=8)
    assert stable_alone.choices[0].text != candidate_alone.choices[0].text  # else the check below proves nothing
    ids = []
    for i in range(6):
        request_id = f"shadowed-{i}-{time.time_ns()}"
        headers, body = await complete(async_openai_client, "route-shadow", max_tokens=8,
                                       extra_headers={"X-Request-Id": request_id})
        ids.append(request_id)
        assert headers["x-loraplex-route"] == f"canary;arm=stable;rollout={rollout['id']}"
        assert body.model == "route-shadow@1" and body.choices[0].text == stable_alone.choices[0].text
    deadline = time.monotonic() + 60
    while (shadow := admin.get("/v1/adapters/route-shadow/rollout").json()["shadow"])["completed"] < 6:
        assert time.monotonic() < deadline, shadow
        await asyncio.sleep(0.2)
    assert shadow["exact_match_rate"] == 0.0 and 0 <= shadow["mean_token_overlap"] < 1
    assert shadow["internal_cost_usd"] > 0
    metrics = metrics_text()
    assert 'loraplex_shadow_requests_total{adapter="route-shadow",outcome="completed"} 6.0' in metrics
    rows = UsageLedger.reader(demo_home / "usage.sqlite").query(model="route-shadow", limit=10_000)
    assert {row["request_id"] for row in rows if row["request_id"].startswith("shadowed-")} == set(ids)
    assert all(row["version"] == "1" for row in rows if row["request_id"] in ids)
    assert sum(row["completion_tokens"] for row in rows if row["request_id"] in ids) == 6 * 8  # nothing more billed
    admin.post("/v1/adapters/route-shadow/rollout/abort")


async def test_a_failing_candidate_falls_back_opens_its_breaker_and_is_rolled_back(
        admin, publish, async_openai_client, demo_home, metrics_text, server, acme):
    from api.tenancy.ledger import UsageLedger

    publish("route-faulty", "sql-helper", "support-bot")
    # The injected fault: the candidate's weights in the store are damaged, so it fails its integrity check on load.
    (demo_home / "registry" / "blobs" / "route-faulty" / "2" / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    rollout = start(admin, "route-faulty", candidate=2, percent=100, guard={"max_error_rate": 0.5, "min_requests": 5})
    for i in range(5):
        headers, body = await complete(async_openai_client, "route-faulty",
                                       extra_headers={"X-Request-Id": f"faulty-{i}-{time.time_ns()}"})
        assert body.model == "route-faulty@1"
        assert headers["x-loraplex-fallback"].startswith("route-faulty@2;reason=load_failed;served=route-faulty@1")
    report = admin.get("/v1/adapters/route-faulty/rollout").json()
    assert report["rollout"]["state"] == "rolled_back" and "error rate 100%" in report["rollout"]["reason"]
    assert [e["kind"] for e in report["events"]] == ["rolled_back", "started"]
    assert report["arms"][1]["errors"] == 5
    headers, body = await complete(async_openai_client, "route-faulty")
    assert body.model == "route-faulty@1" and headers["x-loraplex-route"] == "direct"
    assert "x-loraplex-fallback" not in headers
    metrics = metrics_text()
    assert 'loraplex_rollout_rollbacks_total{adapter="route-faulty"} 1.0' in metrics
    assert 'loraplex_breaker_state{adapter_version="route-faulty@2"} 2.0' in metrics
    pinned = httpx.post(f"{server}/v1/completions", headers=acme, timeout=60,
                        json={"model": "route-faulty@2", "prompt": "x", "max_tokens": 1})
    assert pinned.status_code == 503 and pinned.json()["error"]["code"] == "breaker_open"
    rows = UsageLedger.reader(demo_home / "usage.sqlite").query(model="route-faulty", limit=10_000)
    fell_back = [row for row in rows if row["request_id"].startswith("faulty-")]
    assert len(fell_back) == 5 and all("fallback_from=route-faulty@2" in row["route"] for row in fell_back)
    assert rollout["id"] == report["rollout"]["id"]
