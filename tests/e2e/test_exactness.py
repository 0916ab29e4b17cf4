"""Greedy float32 outputs equal transformers + peft token for token: alone and in one mixed batch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.engine_gate import EngineGate, until_engine_holds

PROMPTS = [
    "Hello world, the quick brown fox",
    "What is the weather today in the city?",
    "Please write a poem about a river and a mountain.",
]
MAX_TOKENS = 24
MIXED_MAX_TOKENS = 32


def _completion_body(model: str, prompt_ids: list[int], stream: bool = False, max_tokens: int = MAX_TOKENS) -> dict:
    return {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "stream": stream}


def _models(base_model_id, adapter_names) -> list[tuple[str, str | None]]:
    return [(base_model_id, None)] + [(name, name) for name in adapter_names]


def test_adapters_change_outputs(hf_reference, tokenizer, adapter_names):
    """Guards the tests below: if an adapter equalled the base model, leakage could not be seen."""
    ids = tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    base = hf_reference.greedy(None, ids, MAX_TOKENS)
    outputs = {name: hf_reference.greedy(name, ids, MAX_TOKENS) for name in adapter_names}
    for name, out in outputs.items():
        assert out != base, f"adapter {name} does not change the output"
    assert len({tuple(o) for o in outputs.values()}) == len(adapter_names)


def test_each_model_alone_matches_hf(server, acme, hf_reference, tokenizer, base_model_id, adapter_names):
    with httpx.Client(base_url=server, headers=acme, timeout=120) as client:
        for model, adapter in _models(base_model_id, adapter_names):
            for prompt in PROMPTS:
                ids = tokenizer.encode(prompt, add_special_tokens=False)
                body = client.post("/v1/completions", json=_completion_body(model, ids)).json()
                choice = body["choices"][0]
                assert body["model"] == (model if adapter is None else f"{model}@1")
                assert choice["token_ids"] == hf_reference.greedy(adapter, ids, MAX_TOKENS), (model, prompt)
                usage = body["usage"]
                assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
                    len(ids), MAX_TOKENS, len(ids) + MAX_TOKENS)
                assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= len(ids)


async def _stream_tokens(client: httpx.AsyncClient, body: dict) -> list[int]:
    """Token ids of one streamed completion."""
    tokens = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: "):])["choices"]:
                tokens.extend(choice.get("token_ids") or [])
    return tokens


@pytest.mark.parametrize("pair", [(0, 1), (1, 2), (2, 0)])
async def test_mixed_batch_matches_hf(server, server_process, acme, keys, hf_reference, tokenizer, base_model_id,
                                      adapter_names, pair):
    """The base model and two adapters in flight together, filling both engine slots: base requests must get
    no adapter (vllm#48421), whichever adapter holds the last slot."""
    models = [(base_model_id, None)] + [(adapter_names[i], adapter_names[i]) for i in pair]
    jobs = []
    for model, adapter in models * 2:
        for prompt in PROMPTS:
            jobs.append((model, adapter, tokenizer.encode(prompt, add_special_tokens=False)))
    async with httpx.AsyncClient(base_url=server, headers=acme, timeout=180) as client:
        for model, _ in models[1:]:  # both adapters into the engine's two slots, so none waits for a load below
            assert (await client.post("/v1/completions", json=_completion_body(model, jobs[0][2]))).status_code == 200
        # The batch shows isolation only if its requests share engine steps: all of them reach the held engine
        # before it runs a step.
        with EngineGate.of(server_process.proc.pid):
            streams = [asyncio.create_task(_stream_tokens(
                client, _completion_body(model, ids, stream=True, max_tokens=MIXED_MAX_TOKENS)))
                for model, _, ids in jobs]
            await until_engine_holds(client, len(jobs), keys.metrics_headers)
        results = await asyncio.gather(*streams)
    for (model, adapter, ids), tokens in zip(jobs, results):
        assert tokens == hf_reference.greedy(adapter, ids, MIXED_MAX_TOKENS), model


def test_slot_reuse_stays_exact(server, acme, hf_reference, tokenizer, adapter_dirs):
    """Four adapters take turns in two engine slots: each load rewrites a slot in place, and the grouped
    ops' cached fused weights must follow (engine/worker/fused_ops.py)."""
    ids = tokenizer.encode(PROMPTS[1], add_special_tokens=False)
    order = list(adapter_dirs) * 2 + list(reversed(adapter_dirs))
    with httpx.Client(base_url=server, headers=acme, timeout=120) as client:
        for name in order:
            body = client.post("/v1/completions", json=_completion_body(name, ids)).json()
            assert body["choices"][0]["token_ids"] == hf_reference.greedy(name, ids, MAX_TOKENS), name


def test_chat_template_path_matches_hf(openai_client, hf_reference, tokenizer, adapter_names):
    messages = [{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "A river?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    for adapter in adapter_names:
        response = openai_client.chat.completions.create(
            model=adapter, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        assert response.usage.prompt_tokens == len(ids)
        assert response.choices[0].model_extra["token_ids"] == hf_reference.greedy(adapter, ids, MAX_TOKENS)
        assert response.choices[0].message.content == tokenizer.decode(
            response.choices[0].model_extra["token_ids"], skip_special_tokens=True)


def test_engine_processes_run_loraplex_lora_ops(server):
    """The exactness above is of the grouped ops, on the native kernel that `make venv` builds: vLLM loaded our
    plugin in its worker process."""
    log = (Path(__file__).resolve().parents[2] / "artifacts" / "server.log").read_text().splitlines()
    worker_lines = [line for line in log if line.startswith(("(Worker", "(VllmWorker"))]
    assert any("grouped LoRA ops installed" in line and "native kernel" in line for line in worker_lines)
    assert any("patched vLLM CPU LoRA ops" in line for line in worker_lines)


def test_the_session_engine_is_compiled_with_lora_ops_in_its_graph(server):
    """The exactness above is of the compiled engine (`make serve`'s default), not of vLLM's eager fallback for LoRA:
    the engine core lifted the rule and the engine reports a compilation mode other than NONE."""
    log = (Path(__file__).resolve().parents[2] / "artifacts" / "server.log").read_text().splitlines()
    assert any(line.startswith("(EngineCore") and "LoRA engine compiled like one without LoRA" in line for line in log)
    ready = [line for line in log if "engine ready in" in line]
    assert ready and "compilation mode NONE" not in ready[0] and "compilation mode" in ready[0]
