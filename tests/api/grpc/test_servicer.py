"""The gRPC front on the fake engine, through tritonclient's own asyncio client on a loopback port: what a Triton
client gets for each call, the errors as status codes, health and reflection. (Engine behaviour: tests/e2e.)"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import tritonclient.grpc.aio as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

from api.grpc.front import SERVICE, GrpcFront
from api.tenancy.config import parse_tenancy_config
from api.tenancy.keys import generate_key, hash_key
from tests.triton_inputs import triton_inputs

KEY = generate_key()
MODEL = "fake-base"


@pytest.fixture
async def front(make_fake_server):
    tenancy = parse_tenancy_config({"tenants": [{"name": "acme", "key_hashes": [hash_key(KEY)], "adapters": ["*"]}]})
    server = make_fake_server(tenancy=tenancy)
    server.lifecycle.ready = True
    front = GrpcFront(server, "127.0.0.1", 0)
    await front.start()
    yield front
    await front.stop(0)


@pytest.fixture
async def client(front):
    async with triton.InferenceServerClient(f"127.0.0.1:{front.port}") as c:
        yield c


AUTH = {"authorization": f"Bearer {KEY}"}


def _text(result) -> str:
    return result.as_numpy("text_output")[0].decode()


async def test_infer_returns_the_prompt_and_its_completion(client, fake_engine):
    result = await client.infer(MODEL, triton_inputs("hello", sampling='{"max_tokens": "3"}'), headers=AUTH,
                                request_id="r1")
    generated = fake_engine.tokenizer().decode([100, 101, 102])
    assert _text(result) == "hello" + generated and result.get_response().id == "r1"
    assert fake_engine.requests[0][2].max_tokens == 3
    excluded = await client.infer(MODEL, triton_inputs("hello", exclude=True), headers=AUTH)
    assert _text(excluded) == fake_engine.tokenizer().decode([100, 101, 102, 103])


async def test_a_stream_sends_each_chunk_and_flags_the_last(client, fake_engine):
    async def requests():
        yield {"model_name": MODEL, "inputs": triton_inputs("hi", stream=True, exclude=True)}

    responses = [r async for r in client.stream_infer(requests(), headers=AUTH)]
    assert all(error is None for _, error in responses)
    texts = [_text(result) for result, _ in responses]
    assert "".join(texts) == fake_engine.tokenizer().decode([100, 101, 102, 103]) and len(texts) == 4
    finals = [result.get_response().parameters["triton_final_response"].bool_param for result, _ in responses]
    assert finals == [False, False, False, True]


@pytest.mark.parametrize("model,headers,sampling,stream,code,fragment", [
    (MODEL, {}, None, False, grpc.StatusCode.UNAUTHENTICATED, "API key"),
    ("nope", AUTH, None, False, grpc.StatusCode.NOT_FOUND, "nope"),
    (MODEL, AUTH, '{"best_of": 2}', False, grpc.StatusCode.INVALID_ARGUMENT, "best_of"),
    (MODEL, AUTH, '{"max_tokens": 1000}', False, grpc.StatusCode.INVALID_ARGUMENT, "maximum context length"),
    (MODEL, AUTH, None, True, grpc.StatusCode.INVALID_ARGUMENT, "ModelStreamInfer"),
])
async def test_errors_are_status_codes_with_the_http_message(client, model, headers, sampling, stream, code,
                                                             fragment):
    with pytest.raises(InferenceServerException) as info:
        await client.infer(model, triton_inputs("x", stream=stream, sampling=sampling), headers=headers)
    assert info.value.status() == str(code) and fragment in info.value.message()


async def test_a_stream_reports_a_refused_request_and_serves_the_next(client, fake_engine):
    async def requests():
        yield {"model_name": "nope", "inputs": triton_inputs("x", stream=True)}
        yield {"model_name": MODEL, "inputs": triton_inputs("x", stream=True, exclude=True)}

    responses = [r async for r in client.stream_infer(requests(), headers=AUTH)]
    assert "NOT_FOUND" in str(responses[0][1]) and all(error is None for _, error in responses[1:])
    assert "".join(_text(r) for r, _ in responses[1:]) == fake_engine.tokenizer().decode([100, 101, 102, 103])


async def test_metadata_readiness_health_and_reflection(client, front):
    assert await client.is_server_live() and await client.is_server_ready()
    assert await client.is_model_ready(MODEL, headers=AUTH) and not await client.is_model_ready("nope", headers=AUTH)
    metadata = await client.get_model_metadata(MODEL, headers=AUTH, as_json=True)
    assert [i["name"] for i in metadata["inputs"]] == ["text_input", "stream", "sampling_parameters",
                                                       "exclude_input_in_output"]
    assert (await client.get_server_metadata(as_json=True))["name"] == "loraplex"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        await front.server.lifecycle.drain(timeout_s=1)
        for _ in range(500):  # until the health service has taken the drain in (its own task)
            status = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
            if status.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.01)
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        [answer] = [a async for a in stub.ServerReflectionInfo(ask())]
        assert SERVICE in {s.name for s in answer.list_services_response.service}


async def test_a_draining_server_refuses_new_calls_as_unavailable(client, front):
    await front.server.lifecycle.drain(timeout_s=1)
    assert not await client.is_server_ready()
    with pytest.raises(InferenceServerException) as info:
        await client.infer(MODEL, triton_inputs("x"), headers=AUTH)
    assert info.value.status() == str(grpc.StatusCode.UNAVAILABLE) and "shutting down" in info.value.message()
