from __future__ import annotations

import struct

import pytest

from api.errors import OpenAIError
from api.grpc import inference_pb2 as pb
from api.grpc.tensors import infer_call, input_values, sampling_fields, text_response


def _raw(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _request(inputs, raw=None, **fields) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", **fields)
    for name, datatype, contents in inputs:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
        if contents is not None:
            tensor.contents.CopyFrom(contents)
    request.raw_input_contents.extend(raw or [])
    return request


TEXT = ("text_input", "BYTES", pb.InferTensorContents(bytes_contents=[b"hi"]))


@pytest.mark.parametrize("inputs,raw,values", [
    ([TEXT], None, {"text_input": b"hi"}),
    ([("text_input", "BYTES", None), ("stream", "BOOL", None)], [_raw(b"h\xc3\xa9"), b"\x01"],
     {"text_input": "hé".encode(), "stream": True}),
    ([TEXT, ("exclude_input_in_output", "BOOL", pb.InferTensorContents(bool_contents=[False]))], None,
     {"text_input": b"hi", "exclude_input_in_output": False}),
])
def test_input_values(inputs, raw, values):
    assert input_values(_request(inputs, raw)) == values


@pytest.mark.parametrize("inputs,raw,fragments", [
    ([], None, ["text_input: missing"]),
    ([TEXT, ("image", "FP32", None)], None, ["image: not an input"]),
    ([("text_input", "FP32", None), ("stream", "BYTES", None)], None,
     ["text_input: datatype 'FP32'", "stream: datatype 'BYTES'"]),
    ([("text_input", "BYTES", pb.InferTensorContents(bytes_contents=[b"a", b"b"]))], None, ["2 elements"]),
    ([("text_input", "BYTES", None)], [b"\x05\x00\x00\x00ab"], ["longer than the raw contents"]),
    ([("text_input", "BYTES", None), ("stream", "BOOL", None)], [_raw(b"x")], ["1 entries for 2 inputs"]),
])
def test_bad_inputs_are_refused_with_every_problem(inputs, raw, fragments):
    with pytest.raises(OpenAIError) as info:
        input_values(_request(inputs, raw))
    assert info.value.status == 400 and all(f in info.value.message for f in fragments), info.value.message


@pytest.mark.parametrize("text,fields,param", [
    ('{"max_tokens": "8", "temperature": 0, "stop": ["x"]}', {"max_tokens": "8", "temperature": 0, "stop": ["x"]},
     None),
    ("", {}, None),
    ('{"best_of": 2, "max_tokens": 4}', None, "sampling_parameters.best_of"),
    ("[1]", None, "sampling_parameters"),
    ("{nope", None, "sampling_parameters"),
])
def test_sampling_fields(text, fields, param):
    if param is None:
        assert sampling_fields(text) == fields
        return
    with pytest.raises(OpenAIError) as info:
        sampling_fields(text)
    assert info.value.param == param


def test_infer_call():
    sampling = ("sampling_parameters", "BYTES", pb.InferTensorContents(bytes_contents=[b'{"max_tokens": 3}']))
    request = _request([TEXT, sampling], model_version="2")
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    call = infer_call(request)
    assert call.body == {"max_tokens": 3, "model": "m@2", "prompt": "hi", "stream": False}
    assert (call.exclude_input, call.empty_final) == (False, True)


def _with_priority(request):
    request.parameters["priority"].int64_param = 1


def _with_logits_output(request):
    request.outputs.add(name="logits")


@pytest.mark.parametrize("change,param", [(_with_priority, "parameters.priority"), (_with_logits_output, "outputs")])
def test_what_is_not_honoured_is_refused(change, param):
    request = _request([TEXT])
    change(request)
    with pytest.raises(OpenAIError) as info:
        infer_call(request)
    assert info.value.param == param


def test_text_response_is_a_raw_bytes_tensor():
    response = text_response(_request([TEXT], id="r1"), "héllo", final=True)
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("text_output", "BYTES", [1])]
    assert response.raw_output_contents[0] == _raw("héllo".encode()) and response.id == "r1"
    assert response.parameters["triton_final_response"].bool_param is True
