"""A ModelInfer request as a completions request, and text as output tensors, with the tensor names of Triton's
vLLM backend, so a client written for it works unchanged. Pure.

Inputs: `text_input` (BYTES, one element: the prompt), and optionally `stream` (BOOL), `sampling_parameters`
(BYTES: a JSON object of vLLM sampling parameters; values may be strings, as Triton's examples send them) and
`exclude_input_in_output` (BOOL). Output: `text_output` (BYTES, one element). A tensor's contents come typed
(`contents`) or raw (`raw_input_contents`: BYTES elements each prefixed by its length, 4 bytes little-endian; BOOL
one byte each). Anything else is refused by name.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from api.errors import bad_request
from api.grpc import inference_pb2 as pb

TEXT_INPUT, STREAM, SAMPLING, EXCLUDE_INPUT, TEXT_OUTPUT = (
    "text_input", "stream", "sampling_parameters", "exclude_input_in_output", "text_output")
INPUT_TYPES = {TEXT_INPUT: "BYTES", STREAM: "BOOL", SAMPLING: "BYTES", EXCLUDE_INPUT: "BOOL"}
# The sampling parameters honoured (vLLM's names), as completions fields of the same meaning.
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids")
# Request parameters: Triton's streaming client asks for an empty last response with this one.
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL_FLAG = "triton_final_response"


@dataclass(frozen=True)
class InferCall:
    """What a ModelInfer request asks for: the completions body, and how to shape the output."""

    body: dict[str, Any]
    exclude_input: bool
    empty_final: bool

    @property
    def stream(self) -> bool:
        return self.body["stream"]

    @property
    def prompt(self) -> str:
        return self.body["prompt"]


def _raw_elements(raw: bytes, datatype: str, name: str) -> list[bytes | bool]:
    if datatype == "BOOL":
        return [b != 0 for b in raw]
    elements, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise bad_request(f"input {name}: raw BYTES contents end inside a length prefix", param=name)
        (size,) = struct.unpack_from("<I", raw, at)
        if at + 4 + size > len(raw):
            raise bad_request(f"input {name}: an element is longer than the raw contents", param=name)
        elements.append(raw[at + 4:at + 4 + size])
        at += 4 + size
    return elements


def input_values(request: pb.ModelInferRequest) -> dict[str, bytes | bool]:
    """Each input's one element; every problem (unknown name, wrong type or size) in one 400."""
    if request.raw_input_contents and len(request.raw_input_contents) != len(request.inputs):
        raise bad_request(f"raw_input_contents has {len(request.raw_input_contents)} entries for "
                          f"{len(request.inputs)} inputs", param="raw_input_contents")
    values, problems = {}, []
    for i, tensor in enumerate(request.inputs):
        expected = INPUT_TYPES.get(tensor.name)
        if expected is None:
            problems.append(f"{tensor.name}: not an input of this model (inputs: {', '.join(INPUT_TYPES)})")
            continue
        if tensor.datatype != expected:
            problems.append(f"{tensor.name}: datatype {tensor.datatype!r}, expected {expected}")
            continue
        if request.raw_input_contents:
            elements = _raw_elements(request.raw_input_contents[i], expected, tensor.name)
        else:
            elements = list(tensor.contents.bool_contents if expected == "BOOL" else tensor.contents.bytes_contents)
        if len(elements) != 1:
            problems.append(f"{tensor.name}: {len(elements)} elements, expected 1 (one request per call)")
            continue
        values[tensor.name] = elements[0]
    if TEXT_INPUT not in values and not any(p.startswith(TEXT_INPUT) for p in problems):
        problems.append(f"{TEXT_INPUT}: missing")
    if problems:
        raise bad_request("Invalid inputs: " + "; ".join(problems) + ".", param="inputs")
    return values


def _utf8(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"input {name} is not UTF-8 text: {e}", param=name) from e


def sampling_fields(text: str) -> dict[str, Any]:
    """`sampling_parameters` as completions fields; names vLLM's server would not honour here are refused."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise bad_request(f"sampling_parameters is not JSON: {e}", param=SAMPLING) from e
    if not isinstance(value, dict):
        raise bad_request("sampling_parameters must be a JSON object", param=SAMPLING)
    unknown = sorted(set(value) - set(SAMPLING_FIELDS))
    if unknown:
        raise bad_request(f"Unsupported sampling parameters: {', '.join(unknown)} (supported: "
                          f"{', '.join(SAMPLING_FIELDS)}).", param=f"{SAMPLING}.{unknown[0]}",
                          code="unsupported_parameter")
    return value


def infer_call(request: pb.ModelInferRequest) -> InferCall:
    """The completions body of a ModelInfer request (`model_version` selects `name@version`)."""
    unknown = sorted(set(request.parameters) - {EMPTY_FINAL})
    if unknown:
        raise bad_request(f"Unsupported request parameters: {', '.join(unknown)}.", param=f"parameters.{unknown[0]}",
                          code="unsupported_parameter")
    other_outputs = sorted({o.name for o in request.outputs} - {TEXT_OUTPUT})
    if other_outputs:
        raise bad_request(f"Unknown outputs: {', '.join(other_outputs)} (this model has {TEXT_OUTPUT}).",
                          param="outputs")
    values = input_values(request)
    sampling = sampling_fields(_utf8(values[SAMPLING], SAMPLING)) if SAMPLING in values else {}
    model = f"{request.model_name}@{request.model_version}" if request.model_version else request.model_name
    body = {**sampling, "model": model, "prompt": _utf8(values[TEXT_INPUT], TEXT_INPUT),
            "stream": bool(values.get(STREAM, False))}
    empty_final = EMPTY_FINAL in request.parameters and request.parameters[EMPTY_FINAL].bool_param
    return InferCall(body, exclude_input=bool(values.get(EXCLUDE_INPUT, False)), empty_final=empty_final)


def text_response(request: pb.ModelInferRequest, text: str, final: bool | None = None) -> pb.ModelInferResponse:
    """`text` as the `text_output` tensor (raw contents); `final` sets Triton's final-response flag (streams)."""
    response = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                     id=request.id)
    if final is not None:
        response.parameters[FINAL_FLAG].bool_param = final
    response.outputs.add(name=TEXT_OUTPUT, datatype="BYTES", shape=[1])
    data = text.encode("utf-8")
    response.raw_output_contents.append(struct.pack("<I", len(data)) + data)
    return response
