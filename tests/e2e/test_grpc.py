"""The gRPC front on the real engine: Triton's client (tritonclient) and plain grpcio stubs get the greedy text that
HTTP gets, for the base model and adapters, whole and streamed; a tenant reaches only its adapters; a cancelled
stream frees its engine request and is billed once, like HTTP."""

from __future__ import annotations

import threading
import time

import grpc
import httpx
import pytest
import tritonclient.grpc as triton

from api.grpc import inference_pb2 as pb
from api.grpc.inference_pb2_grpc import GRPCInferenceServiceStub
from tests.conftest import ledger_rows
from tests.engine_gate import EngineGate, wait_until
from tests.triton_inputs import triton_inputs

PROMPT = "The harbour at dawn"
SAMPLING = {"max_tokens": 12, "temperature": 0}


def _text(result) -> str:
    return result.as_numpy("text_output")[0].decode()


@pytest.fixture(scope="module")
def client(grpc_address):
    with triton.InferenceServerClient(grpc_address) as c:
        yield c


@pytest.mark.parametrize("model_index", [None, 0, 1, 2])
def test_greedy_text_equals_http_whole_and_streamed(client, server, acme, base_model_id, adapter_names,
                                                    model_index):
    model = base_model_id if model_index is None else adapter_names[model_index]
    http = httpx.post(f"{server}/v1/completions", headers=acme, timeout=60,
                      json={"model": model, "prompt": PROMPT, **SAMPLING}).json()["choices"][0]["text"]
    headers = {"authorization": acme["Authorization"]}
    whole = _text(client.infer(model, triton_inputs(PROMPT, sampling=SAMPLING, exclude=True), headers=headers))
    chunks: list = []
    client.start_stream(callback=lambda result, error: chunks.append((result, error)), headers=headers)
    client.async_stream_infer(model, triton_inputs(PROMPT, stream=True, sampling=SAMPLING, exclude=True),
                              enable_empty_final_response=True)
    client.stop_stream()  # waits for the stream's responses
    assert all(error is None for _, error in chunks)
    *texts, final = [result for result, _ in chunks]
    assert whole == http == "".join(_text(r) for r in texts)
    assert final.as_numpy("text_output") is None and final.get_response().parameters["triton_final_response"].bool_param


def test_a_tenant_reaches_only_its_adapters(client, keys, adapter_names):
    globex = {"authorization": f"Bearer {keys.tenants['globex']}"}
    with pytest.raises(triton.InferenceServerException) as info:
        client.infer(adapter_names[0], triton_inputs(PROMPT, sampling=SAMPLING), headers=globex)
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert not client.is_model_ready(adapter_names[0], headers=globex)


def test_a_cancelled_stream_is_aborted_and_billed_once(grpc_address, server, server_process, acme, keys):
    request_id = f"grpc-cancel-{time.time_ns()}"
    request = pb.ModelInferRequest(model_name="poet", id=request_id)
    for name, datatype, value in [("text_input", "BYTES", b"a long story"), ("stream", "BOOL", True),
                                  ("sampling_parameters", "BYTES", b'{"max_tokens": 1000, "ignore_eos": true}')]:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
        if datatype == "BOOL":
            tensor.contents.bool_contents.append(value)
        else:
            tensor.contents.bytes_contents.append(value)
    received: list = []

    def read(call) -> None:
        try:
            for response in call:
                received.append(response)
        except grpc.RpcError:
            pass

    # The engine is held before the call starts (a sync stream-stream call sends its request as it is made) and
    # while the client cancels, so it cancels with nearly all 1000 tokens still to come.
    with grpc.insecure_channel(grpc_address) as channel, EngineGate.of(server_process.proc.pid) as gate:
        call = GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]),
                                                                  metadata=[("authorization", acme["Authorization"])])
        reader = threading.Thread(target=read, args=(call,), daemon=True)
        reader.start()
        gate.pulse_until(lambda: bool(received))
        call.cancel()
        wait_until(lambda: bool(ledger_rows(server, keys, request_id)), "a ledger row for the cancelled stream")
    reader.join(timeout=30)
    [row] = ledger_rows(server, keys, request_id)
    assert (row["status"], row["finish"]) == (499, "aborted"), (row, len(received))
    assert 1 <= row["completion_tokens"] < 1000
