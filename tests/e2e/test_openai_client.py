"""The real openai client against the real server: listing, chat, completions, streaming, errors."""

from __future__ import annotations

import httpx
import openai
import pytest


def served_id(model: str, base_model_id: str) -> str:
    """Responses name the exact version: the demo adapters are version 1 of their names."""
    return model if model == base_model_id else f"{model}@1"


def test_model_list(openai_client, base_model_id, adapter_names, adapter_dirs):
    models = {m.id: m for m in openai_client.models.list().data}
    assert {base_model_id, *adapter_dirs} <= set(models)
    assert set(adapter_names) < set(adapter_dirs)
    assert models[base_model_id].model_extra.get("parent") is None
    for name in adapter_names:
        assert models[name].model_extra["parent"] == base_model_id
        assert models[name].model_extra["versions"] == [1]
        assert models[name].model_extra["aliases"] == {"stable": 1}
    assert openai_client.models.retrieve(adapter_names[0]).id == f"{adapter_names[0]}@1"
    assert openai_client.models.retrieve(f"{adapter_names[0]}@1").id == f"{adapter_names[0]}@1"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_switches_model_per_request(openai_client, base_model_id, adapter_names, stream):
    outputs = {}
    for model in [base_model_id, *adapter_names]:
        kwargs = dict(model=model, messages=[{"role": "user", "content": "hello there"}], max_tokens=12,
                      temperature=0, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(openai_client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kwargs))
            assert chunks[0].choices[0].delta.role == "assistant"
            assert {c.model for c in chunks} == {served_id(model, base_model_id)}
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
            assert chunks[-1].choices == []
            assert all(c.usage is None for c in chunks[:-1])
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        else:
            response = openai_client.chat.completions.create(**kwargs)
            assert response.model == served_id(model, base_model_id)
            text, usage = response.choices[0].message.content, response.usage
            assert response.choices[0].finish_reason == "length"
        assert usage.completion_tokens == 12
        assert usage.total_tokens == usage.prompt_tokens + 12
        outputs[model] = text
    assert len(set(outputs.values())) == len(outputs), "every model should answer differently"


def test_stream_equals_non_stream(openai_client, adapter_names):
    kwargs = dict(model=adapter_names[1], prompt="the weather today", max_tokens=16, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = openai_client.completions.create(**kwargs)
    streamed = list(openai_client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text


def test_completions_batch_of_prompts_and_n(openai_client, adapter_names):
    response = openai_client.completions.create(
        model=adapter_names[0], prompt=["one two", "red green blue"], n=2, max_tokens=5, temperature=0.8,
        seed=7, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in response.choices) == [0, 1, 2, 3]
    assert response.usage.completion_tokens == 4 * 5


def test_seed_makes_sampling_repeatable(openai_client, base_model_id):
    kwargs = dict(model=base_model_id, prompt="the cat", max_tokens=10, temperature=1.0, top_p=0.9, seed=42,
                  extra_body={"ignore_eos": True, "top_k": 50})
    assert openai_client.completions.create(**kwargs).choices[0].text == \
        openai_client.completions.create(**kwargs).choices[0].text


def test_logprobs(openai_client, adapter_names):
    chat = openai_client.chat.completions.create(
        model=adapter_names[2], messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    for position in content:
        assert len(position.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert position.logprob == pytest.approx(position.top_logprobs[0].logprob)
    completion = openai_client.completions.create(
        model=adapter_names[2], prompt="hi", max_tokens=3, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True})
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        # Greedy picks the most likely token (the dict is keyed by text, so tokens decoding alike collide).
        assert all(chosen >= lp - 1e-6 for lp in top.values())


def test_stop_and_penalties(openai_client, base_model_id):
    free = openai_client.completions.create(model=base_model_id, prompt="the quick", max_tokens=20,
                                            temperature=0, extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text[len(text) // 2:][:3]
    stopped = openai_client.completions.create(model=base_model_id, prompt="the quick", max_tokens=20,
                                               temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert stop not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    penalised = openai_client.completions.create(
        model=base_model_id, prompt="the quick", max_tokens=20, temperature=0, presence_penalty=2.0,
        frequency_penalty=2.0, extra_body={"ignore_eos": True, "repetition_penalty": 1.5, "min_tokens": 20})
    assert penalised.usage.completion_tokens == 20


BAD_REQUESTS = [
    ("max_tokens", {"max_tokens": -1}),
    ("max_tokens", {"max_tokens": 10**9}),
    ("n", {"n": 10**6}),
    ("temperature", {"temperature": -0.5}),
    ("top_p", {"top_p": 0}),
    ("top_p", {"top_p": 1.5}),
    ("messages", {"messages": []}),
    ("top_logprobs", {"top_logprobs": 3}),
]


@pytest.mark.parametrize("param,override", BAD_REQUESTS, ids=[f"{p}={v}" for p, v in BAD_REQUESTS])
def test_bad_parameters_are_400(openai_client, base_model_id, param, override):
    kwargs = {"model": base_model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
              **override}
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(**kwargs)
    error = info.value.body
    assert info.value.status_code == 400
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_prompt_over_context_names_prompt(openai_client, base_model_id):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.completions.create(model=base_model_id, prompt=[5] * 2000, max_tokens=1)
    assert info.value.body["param"] == "prompt"
    assert info.value.body["code"] == "context_length_exceeded"


def test_unknown_model_is_404(openai_client):
    with pytest.raises(openai.NotFoundError) as info:
        openai_client.chat.completions.create(model="no-such-adapter", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("no-such-adapter")


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"model": 3, "messages": "hi"}', b""])
def test_malformed_bodies_are_openai_400(server, body, acme):
    response = httpx.post(f"{server}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json", **acme})
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_request_id_echoed_or_generated(server, base_model_id, acme):
    given = httpx.get(f"{server}/v1/models", headers={"X-Request-Id": "trace-123", **acme})
    assert given.headers["x-request-id"] == "trace-123"
    generated = httpx.get(f"{server}/v1/models", headers=acme)
    assert len(generated.headers["x-request-id"]) == 32


def test_server_keeps_serving_after_bad_requests(openai_client, base_model_id):
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            openai_client.completions.create(model=base_model_id, prompt="x", max_tokens=10**7)
    ok = openai_client.completions.create(model=base_model_id, prompt="x", max_tokens=3,
                                          extra_body={"ignore_eos": True})
    assert ok.usage.completion_tokens == 3


def test_tokenize_gives_the_prompt_chat_serves_and_only_for_models_the_tenant_may_use(server, keys, openai_client,
                                                                                      adapter_names):
    messages = [{"role": "user", "content": "count the tokens"}]
    served = openai_client.chat.completions.create(model=adapter_names[0], messages=messages, max_tokens=1,
                                                   extra_body={"return_token_ids": True})
    tokenized = httpx.post(f"{server}/tokenize", headers=keys.headers("acme"), timeout=30,
                           json={"model": adapter_names[0], "messages": messages}).json()
    assert tokenized["tokens"] == served.model_extra["prompt_token_ids"]
    detokenized = httpx.post(f"{server}/detokenize", headers=keys.headers("acme"), timeout=30,
                             json={"model": adapter_names[0], "tokens": tokenized["tokens"]}).json()
    assert "count the tokens" in detokenized["prompt"]
    refused = httpx.post(f"{server}/tokenize", headers=keys.headers("globex"), timeout=30,
                         json={"model": adapter_names[0], "prompt": "x"})
    assert refused.status_code == 404
