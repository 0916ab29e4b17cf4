"""The registry behind the real server: publish while serving, atomic version swaps, 200 adapters through
two engine slots, and the admin API."""

from __future__ import annotations

import asyncio
import io
import json
import random
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.identity import parse_model_ref
from adapters.manifest import blob_key
from tests.engine_gate import EngineGate, until_engine_holds

MAX_TOKENS = 12


def _body(model: str, ids: list[int], stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
    return {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": stream}


def _variant(template: Path, out: Path, seed: int) -> Path:
    """A copy of `template` with new random LoRA weights (A and B non-zero), seeded."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(template / "adapter_model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.randn(v.shape, generator=generator) * 0.3 for k, v in sorted(tensors.items())},
              out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text((template / "adapter_config.json").read_text())
    return out


@pytest.fixture(scope="module")
def template(adapter_dirs) -> Path:
    return adapter_dirs["sql-helper"]  # rank 8 on q_proj and v_proj


async def _stream(client: httpx.AsyncClient, body: dict, started: asyncio.Event | None = None) -> dict:
    tokens, model, header = [], None, None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        header = response.headers["x-loraplex-model"]
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            model = chunk["model"]
            for choice in chunk["choices"]:
                tokens.extend(choice.get("token_ids") or [])
            if started is not None:
                started.set()
    return {"tokens": tokens, "model": model, "header": header}


async def test_version_swap_under_load(server, acme, keys, registry, template, tmp_path, tokenizer,
                                       hf_reference):
    """Requests running when `stable` moves finish on their version; the next ones get the new one; every
    response names the version that served it and its tokens equal HF + peft for that version."""
    folders = {1: _variant(template, tmp_path / "v1", seed=101), 2: _variant(template, tmp_path / "v2", seed=202)}
    assert registry.push(folders[1], "swap").version == 1
    listed = httpx.get(f"{server}/v1/models", headers=acme).json()["data"]
    assert any(card["id"] == "swap" for card in listed), "published while serving, seen without restart"
    assert registry.push(folders[2], "swap").version == 2
    admin = keys.admin_headers
    # Published while serving, and not serving: stable stays on 1 until the promotion below.
    stable = httpx.get(f"{server}/v1/adapters/swap", headers=admin).json()["aliases"]["stable"]
    assert stable == 1

    ids = tokenizer.encode("the river runs to the sea", add_special_tokens=False)
    async with httpx.AsyncClient(base_url=server, headers=acme, timeout=180) as client:
        first_started = [asyncio.Event() for _ in range(6)]
        first = [asyncio.create_task(_stream(client, _body("swap", ids, True, max_tokens=48), event))
                 for event in first_started]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_started)), 120)
        promoted = await client.post("/v1/adapters/swap/promote", json={"version": 2}, headers=admin)
        assert promoted.status_code == 200
        second = [asyncio.create_task(_stream(client, _body("swap", ids, True, max_tokens=48))) for _ in range(6)]
        old, new = await asyncio.gather(*first), await asyncio.gather(*second)
    for results, version in ((old, 1), (new, 2)):
        expected = hf_reference.greedy(folders[version], ids, 48)
        for result in results:
            assert result["model"] == result["header"] == f"swap@{version}"
            assert result["tokens"] == expected
    assert hf_reference.greedy(folders[1], ids, 48) != hf_reference.greedy(folders[2], ids, 48)
    pinned = httpx.post(f"{server}/v1/completions", json=_body("swap@1", ids, False, 48), headers=acme).json()
    assert pinned["model"] == "swap@1" and pinned["choices"][0]["token_ids"] == old[0]["tokens"]
    by_alias = httpx.post(f"{server}/v1/completions", json=_body("swap:stable", ids, False, 8), headers=acme)
    assert by_alias.json()["model"] == "swap@2"


def _scrape(metrics_text) -> dict:
    samples = {}
    for family in text_string_to_metric_families(metrics_text()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


async def test_200_adapters_through_two_slots(server, acme, registry, template, tmp_path, tokenizer,
                                              hf_reference, metrics_text):
    """200 published adapters, max_cpu_loras 8 and max_loras 2, random traffic: every request served, CPU
    tier evictions happen, and a sample of outputs stays exact."""
    folders = {}
    for i in range(200):
        name = f"many-{i:03d}"
        folders[name] = _variant(template, tmp_path / name, seed=1000 + i)
        assert registry.push(folders[name], name).version == 1
    rng = random.Random(7)
    ids = tokenizer.encode("hello world", add_special_tokens=False)
    picks = [f"many-{rng.randrange(200):03d}" for _ in range(80)]
    before = _scrape(metrics_text)
    semaphore = asyncio.Semaphore(16)

    async def one(client, name):
        async with semaphore:
            response = await client.post("/v1/completions", json=_body(name, ids, False, 8))
            assert response.status_code == 200, response.text
            return response.json()

    async with httpx.AsyncClient(base_url=server, headers=acme, timeout=300) as client:
        results = await asyncio.gather(*(one(client, name) for name in picks))
    for name, result in zip(picks, results):
        assert result["model"] == f"{name}@1"
    for name, result in list(zip(picks, results))[::10]:
        assert result["choices"][0]["token_ids"] == hf_reference.greedy(folders[name], ids, 8), name
    after = _scrape(metrics_text)
    evictions = after[("loraplex_adapter_evictions_total", (("tier", "cpu"),))] - before.get(
        ("loraplex_adapter_evictions_total", (("tier", "cpu"),)), 0)
    assert evictions >= len(set(picks)) - 8
    data = httpx.get(f"{server}/dashboard/data", headers={"Authorization": acme["Authorization"]})
    assert data.status_code == 403  # the dashboard's data is the operator's


async def test_when_every_slot_is_taken_a_request_whose_adapter_runs_starts_first(
        server, server_process, acme, keys, tokenizer, hf_reference, adapter_dirs):
    """32 long sql-helper requests fill the session engine's 32 slots. A poet request waits, then a sql-helper
    one. The slot one holder's client gives up goes to sql-helper, whose adapter runs (adapter-aware admission),
    the next one to poet; both answer as HF + peft does.

    The engine is held throughout the choice, so no holder can finish and free a slot of its own accord: the
    slots free only when the test cancels a holder. The order is read from the ledger (arrival + queue time)."""
    ids = tokenizer.encode("the river runs to the sea", add_special_tokens=False)
    request_ids = {model: f"slot-{model}-{uuid.uuid4().hex}" for model in ("poet", "sql-helper")}

    async def admission(client: httpx.AsyncClient, state: str) -> float:
        """loraplex_admission_<state>_requests, all tenants; read without blocking the holders' event loop."""
        name = f"loraplex_admission_{state}_requests"
        page = await client.get("/metrics", headers=keys.metrics_headers, params=[("name[]", name)])
        return sum(s.value for family in text_string_to_metric_families(page.text) for s in family.samples)

    async def until(client: httpx.AsyncClient, state: str, n: int) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while await admission(client, state) != n:
            assert asyncio.get_running_loop().time() < deadline, f"never {n} {state}"
            await asyncio.sleep(0.02)

    async with httpx.AsyncClient(base_url=server, headers=acme, timeout=300) as client:
        gate = EngineGate.of(server_process.proc.pid)
        gate.hold()
        # Not streamed: the test reads nothing while they run, and a cancelled one's client leaves at once.
        holders = [asyncio.create_task(client.post("/v1/completions", json=_body("sql-helper", ids, False, 1000)))
                   for _ in range(32)]
        try:
            await until(client, "running", 32)
            waiting = {}
            for n, model in enumerate(("poet", "sql-helper"), start=1):
                waiting[model] = asyncio.create_task(client.post(
                    "/v1/completions", json=_body(model, ids, False), headers={"X-Request-Id": request_ids[model]}))
                await until(client, "queued", n)
            for n, holder in enumerate(holders[:2]):  # one slot frees, the first waiter starts; then the second
                holder.cancel()
                await until(client, "queued", 1 - n)
            gate.release()
            sql = await asyncio.wait_for(waiting["sql-helper"], 120)
            poet = await asyncio.wait_for(waiting["poet"], 120)
        finally:
            gate.release()
            for holder in holders:
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
        rows = {r["request_id"]: r for r in (await client.get("/v1/usage?limit=10000",
                                                             headers=keys.admin_headers)).json()["data"]}
    for model, response in (("sql-helper", sql), ("poet", poet)):
        assert response.status_code == 200, response.text
        expected = hf_reference.greedy(adapter_dirs[model], ids, MAX_TOKENS)
        assert response.json()["choices"][0]["token_ids"] == expected, model

    def started(model: str) -> float:  # when admission let it start (wall clock)
        row = rows[request_ids[model]]
        return row["created_at"] - row["e2e_s"] + row["queue_s"]

    assert started("sql-helper") < started("poet"), "poet (queued first) took the first free slot"


def _tar_gz(folder: Path, arcname: str = "adapter") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return buffer.getvalue()


def test_admin_api(server, acme, keys, template, tmp_path):
    admin = keys.admin_headers
    archive = {"content-type": "application/gzip"}
    folder = _variant(template, tmp_path / "up", seed=5)
    refused = httpx.post(f"{server}/v1/adapters?name=uploaded", content=_tar_gz(folder), headers={**acme, **archive})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
    created = httpx.post(f"{server}/v1/adapters?name=uploaded&description=via+api", content=_tar_gz(folder),
                         headers={**admin, **archive})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "uploaded" and created.json()["version"] == 1

    escape = io.BytesIO()
    with tarfile.open(fileobj=escape, mode="w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../../evil.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bad = httpx.post(f"{server}/v1/adapters?name=evil", content=escape.getvalue(), headers={**admin, **archive})
    assert bad.status_code == 400 and ".." in bad.json()["error"]["message"]

    pickled = _variant(template, tmp_path / "pickled", seed=6)
    (pickled / "adapter_model.bin").write_bytes(b"not allowed")
    bad = httpx.post(f"{server}/v1/adapters?name=pickled", content=_tar_gz(pickled), headers={**admin, **archive})
    assert bad.status_code == 400 and "adapter_model.bin" in bad.json()["error"]["message"]

    listing = httpx.get(f"{server}/v1/adapters/uploaded", headers=admin).json()
    assert listing["aliases"] == {"stable": 1} and listing["versions"][0]["description"] == "via api"
    loaded = httpx.post(f"{server}/v1/adapters/uploaded@1/load", headers=admin).json()
    assert loaded["model"] == "uploaded@1"
    assert "cpu" in httpx.get(f"{server}/v1/adapters/uploaded", headers=admin).json()["versions"][0]["resident"]
    assert httpx.post(f"{server}/v1/adapters/uploaded@1/evict", headers=admin).json()["evicted"] is True
    in_use = httpx.delete(f"{server}/v1/adapters/uploaded/versions/1", headers=admin)
    assert in_use.status_code == 409, in_use.text
    missing = httpx.post(f"{server}/v1/adapters/uploaded/promote", json={"version": 9}, headers=admin)
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}


async def test_a_published_mixture_serves_what_transformers_and_peft_compute(
        server, server_process, acme, keys, registry, hf_reference, tokenizer, base_model_id, tmp_path):
    """A composition is one more adapter to the engine: its greedy outputs equal HF + peft's with the mixture,
    alone, and in one batch beside the base model and one of its own components."""
    manifest, _ = registry.compose("blend-e2e", [(parse_model_ref("sql-helper@1"), 0.7),
                                                 (parse_model_ref("support-bot@1"), -0.3)])
    folder = tmp_path / "blend"
    folder.mkdir()
    for file in manifest.files:
        registry.store.get_file(blob_key(manifest, file), folder / file.path)
    ids = tokenizer.encode("a mixture of two adapters", add_special_tokens=False)

    def body(model: str, max_tokens: int = 16) -> dict:
        return {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}

    async with httpx.AsyncClient(base_url=server, headers=acme, timeout=120) as client:
        response = await client.post("/v1/completions", json=body("blend-e2e"))
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "blend-e2e@1"
        served = response.json()["choices"][0]["token_ids"]
        assert (await client.post("/v1/completions", json=body("sql-helper", 1))).status_code == 200  # in its slot
        models = [base_model_id, "blend-e2e", "sql-helper"] * 2
        with EngineGate.of(server_process.proc.pid):
            batch = [asyncio.create_task(client.post("/v1/completions", json=body(m))) for m in models]
            await until_engine_holds(client, len(models), keys.metrics_headers)
        mixed = [r.json()["choices"][0]["token_ids"] for r in await asyncio.gather(*batch)]
    assert served == hf_reference.greedy(folder, ids, 16)
    assert served == _peft_cat_greedy(hf_reference, {"sql-helper": 0.7, "support-bot": -0.3}, ids, 16)
    assert served != hf_reference.greedy("sql-helper", ids, 16)
    expected = {base_model_id: hf_reference.greedy(None, ids, 16), "blend-e2e": served,
                "sql-helper": hf_reference.greedy("sql-helper", ids, 16)}
    assert mixed == [expected[m] for m in models]


async def test_a_mixture_named_per_request_is_built_once_and_serves_what_peft_computes(
        server, server_process, acme, keys, registry, hf_reference, tokenizer, base_model_id):
    """`model` = "a*w+b*w": the mixture is built on first use, served exact (alone and batched beside the base model
    and one of its parts), named by its parts in the response and the ledger, and found again, not rebuilt."""
    spelling, canonical = "sql-helper*0.7+support-bot@1*-0.3", "sql-helper@1*0.7+support-bot@1*-0.3"
    ids = tokenizer.encode("a mixture named per request", add_special_tokens=False)

    def body(model: str, max_tokens: int = 16) -> dict:
        return {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}

    def mixtures() -> list[str]:
        return sorted(s.name for s in registry.list() if s.name.startswith("mixture-"))

    before = mixtures()
    async with httpx.AsyncClient(base_url=server, headers=acme, timeout=120) as client:
        response = await client.post("/v1/completions", json=body(spelling))
        assert response.status_code == 200, response.text
        assert response.json()["model"] == canonical and response.headers["x-loraplex-model"] == canonical
        served = response.json()["choices"][0]["token_ids"]
        built = [name for name in mixtures() if name not in before]
        assert len(built) == 1
        models = [base_model_id, spelling, "sql-helper"] * 2
        with EngineGate.of(server_process.proc.pid):
            batch = [asyncio.create_task(client.post("/v1/completions", json=body(m))) for m in models]
            await until_engine_holds(client, len(models), keys.metrics_headers)
        mixed = [r.json()["choices"][0]["token_ids"] for r in await asyncio.gather(*batch)]
        listed = (await client.get("/v1/models")).json()["data"]
        direct = await client.post("/v1/completions", json=body(built[0]))
        other = await client.post("/v1/completions", json=body(spelling), headers=keys.headers("obs"))
        usage = (await client.get("/v1/usage?limit=10000")).json()["data"]
    assert served == _peft_cat_greedy(hf_reference, {"sql-helper": 0.7, "support-bot": -0.3}, ids, 16)
    expected = {base_model_id: hf_reference.greedy(None, ids, 16), spelling: served,
                "sql-helper": hf_reference.greedy("sql-helper", ids, 16)}
    assert mixed == [expected[m] for m in models]
    assert mixtures() == sorted(before + built)  # asked for seven times, built once
    assert not any(card["id"].startswith("mixture-") for card in listed)
    assert direct.status_code == 404  # a built mixture is called by its parts, not by its registry name
    assert (other.status_code, other.json()["error"]["code"]) == (403, "mixtures_not_allowed")
    assert canonical in {row["model"] for row in usage}


def _peft_cat_greedy(hf_reference, weights: dict[str, float], ids: list[int], count: int) -> list[int]:
    """Greedy tokens of the mixture PEFT builds itself (`add_weighted_adapter`, `cat`), float32, no KV cache."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    names = list(weights)
    base = AutoModelForCausalLM.from_pretrained(hf_reference.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, hf_reference.adapter_dirs[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.load_adapter(hf_reference.adapter_dirs[name], adapter_name=name)
    model.add_weighted_adapter(names, list(weights.values()), "mix", combination_type="cat")
    model.set_adapter("mix")
    model.eval()
    tokens, out = torch.tensor([ids]), []
    with torch.no_grad():
        for _ in range(count):
            out.append(int(model(tokens).logits[0, -1].argmax()))
            tokens = torch.cat([tokens, torch.tensor([[out[-1]]])], dim=1)
    return out
