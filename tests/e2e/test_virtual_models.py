"""Virtual models and drift on the real server (real engine, real `openai` client): a cascade whose thresholds
are crafted from a measured first run escalates exactly when it should; an ensemble reports every member;
drift shows in /metrics once prompt lengths shift after the reference window."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest
import yaml

from tests.conftest import DRIFT_WINDOW

PROMPT = [{"role": "user", "content": "List every customer who ordered twice."}]
SAMPLING = {"temperature": 0, "max_tokens": 8}


def _chat(client, model: str, request_id: str | None = None):
    headers = {"X-Request-Id": request_id} if request_id else None
    raw = client.chat.completions.with_raw_response.create(model=model, messages=PROMPT, extra_headers=headers,
                                                           **SAMPLING)
    return raw.headers, raw.parse()


def _mean(logprobs) -> float:
    return sum(t.logprob for t in logprobs.content) / len(logprobs.content)


@pytest.fixture
def reload_virtual_models(server, keys, tenants_file):
    """Writes extra virtual models into the session's tenants file and reloads them; restores both after."""
    original = tenants_file.read_text()

    def reload(extra: dict) -> None:
        config = yaml.safe_load(original)
        config["virtual_models"] = {**config["virtual_models"], **extra}
        tenants_file.write_text(yaml.safe_dump(config, sort_keys=False))
        r = httpx.post(f"{server}/v1/virtual-models/reload", headers=keys.admin_headers, timeout=30)
        assert r.status_code == 200, r.text

    yield reload
    tenants_file.write_text(original)
    httpx.post(f"{server}/v1/virtual-models/reload", headers=keys.admin_headers, timeout=30).raise_for_status()


def test_cascade_escalates_exactly_when_its_rule_fires(openai_client, reload_virtual_models, server, acme):
    first = openai_client.chat.completions.create(model="sql-helper", messages=PROMPT, logprobs=True, **SAMPLING)
    mean, text = _mean(first.choices[0].logprobs), first.choices[0].message.content
    assert text, "the crafted rules need a non-empty first answer"
    stages = ["sql-helper", "poet"]
    reload_virtual_models({
        "lp-up": {"cascade": {"stages": stages, "escalate_when": {"mean_logprob_below": mean + 0.05}}},
        "lp-stay": {"cascade": {"stages": stages, "escalate_when": {"mean_logprob_below": mean - 0.05}}},
        "re-up": {"cascade": {"stages": stages, "escalate_when": {"output_matches": re.escape(text)}}},
        "re-stay": {"cascade": {"stages": stages, "escalate_when": {"output_matches": re.escape(text) + "#"}}},
    })
    for model, stage, reason in [("lp-up", 1, "mean_logprob"), ("lp-stay", 0, None),
                                 ("re-up", 1, "output_matches"), ("re-stay", 0, None)]:
        request_id = f"{model}-{time.time_ns()}"
        headers, response = _chat(openai_client, model, request_id)
        info = response.model_extra["loraplex"]
        assert headers["x-loraplex-stage"] == str(stage) and info["position"] == stage, model
        assert response.model == headers["x-loraplex-model"] == info["answered_by"]
        assert response.model.split("@")[0] == stages[stage]
        runs = info["runs"]
        assert len(runs) == stage + 1 and runs[0]["text"] == text
        assert runs[0]["mean_logprob"] == pytest.approx(mean, abs=1e-3)
        assert runs[0]["reason"] == reason
        assert response.choices[0].logprobs is None
        usage = httpx.get(f"{server}/v1/usage?limit=10000", headers=acme).json()["data"]
        rows = [row for row in usage if row["request_id"].startswith(request_id + ".")]
        assert sorted(row["request_id"] for row in rows) == sorted(run["request_id"] for run in runs)
        assert response.usage.completion_tokens == sum(row["completion_tokens"] for row in rows)
        assert response.usage.prompt_tokens == sum(row["prompt_tokens"] for row in rows)


def test_ensemble_reports_members_and_refuses_streaming(openai_client):
    headers, response = _chat(openai_client, "vote")
    info = response.model_extra["loraplex"]
    assert [run["model"].split("@")[0] for run in info["runs"]] == ["sql-helper", "poet", "support-bot"]
    assert [run["chosen"] for run in info["runs"]].count(True) == 1
    winner = info["runs"][info["position"]]
    assert response.choices[0].message.content == winner["text"] and response.model == winner["model"]
    assert headers["x-loraplex-member"] == str(info["position"])
    assert response.usage.completion_tokens == sum(run["usage"]["completion_tokens"] for run in info["runs"])
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.chat.completions.create(model="vote", messages=PROMPT, stream=True, **SAMPLING)
    assert refused.value.status_code == 400 and refused.value.body["param"] == "stream"


def test_models_lists_virtual_models_a_tenant_may_run(server, keys):
    def virtual(tenant: str) -> set[str]:
        cards = httpx.get(f"{server}/v1/models", headers=keys.headers(tenant)).json()["data"]
        return {card["id"] for card in cards if "kind" in card}

    assert {"triage", "vote", "sql-pair"} <= virtual("acme")
    assert virtual("tiny") == {"sql-pair"}  # it may use sql-helper only
    assert virtual("globex") == set()


async def test_prompt_length_shift_marks_drift(server, keys, registry, adapter_dirs, async_openai_client,
                                               metrics_text):
    name = f"drift-{time.time_ns() % 10**8}"
    version = registry.push(adapter_dirs["sql-helper"], name).version

    async def batch(prompt: str) -> None:
        await asyncio.gather(*(async_openai_client.completions.create(model=name, prompt=prompt, max_tokens=2,
                                                                     temperature=0) for _ in range(DRIFT_WINDOW)))

    def gauge(metric: str, feature: str) -> float | None:
        found = re.search(rf'^{metric}{{feature="{feature}",model="{name}",version="{version}"}} (\S+)$',
                          metrics_text(), re.MULTILINE)
        return float(found.group(1)) if found else None

    await batch("short prompt")  # the reference window
    assert gauge("loraplex_drift_psi", "prompt_tokens") is None  # no current window yet
    await batch("short prompt")
    assert gauge("loraplex_drift_psi", "prompt_tokens") == 0.0
    assert gauge("loraplex_drift_detected", "prompt_tokens") == 0.0
    await batch("a much longer prompt " * 12)
    threshold = float(re.search(r"^loraplex_drift_threshold (\S+)$", metrics_text(), re.MULTILINE).group(1))
    assert gauge("loraplex_drift_psi", "prompt_tokens") >= threshold
    assert gauge("loraplex_drift_detected", "prompt_tokens") == 1.0
    data = (await asyncio.to_thread(httpx.get, f"{server}/dashboard/data", headers=keys.admin_headers)).json()["drift"]
    [row] = [v for v in data["versions"] if v["model"] == name]
    assert "prompt_tokens" in row["drifted"] and row["reference"] == DRIFT_WINDOW

    def pin(model: str) -> httpx.Response:
        return httpx.post(f"{server}/v1/drift/{model}/pin", headers=keys.admin_headers)

    assert (await asyncio.to_thread(pin, f"{name}@{version + 1}")).status_code == 404
    pinned = await asyncio.to_thread(pin, f"{name}@{version}")
    assert pinned.json() == {"model": name, "version": str(version), "reference": DRIFT_WINDOW, "pinned": True}
    await batch("a much longer prompt " * 12)  # the shifted traffic is now the reference: no drift
    assert gauge("loraplex_drift_psi", "prompt_tokens") == 0.0
    assert gauge("loraplex_drift_detected", "prompt_tokens") == 0.0
