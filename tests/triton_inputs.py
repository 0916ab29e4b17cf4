"""The input tensors a Triton vLLM-backend client sends (tests of the gRPC front, on the fake and the real engine)."""

from __future__ import annotations

import json

import numpy as np
from tritonclient.grpc import InferInput


def triton_inputs(prompt: str, stream: bool = False, sampling: dict | str | None = None,
                  exclude: bool = False) -> list[InferInput]:
    """`sampling`: a dict (sent as JSON) or the raw text of `sampling_parameters`."""
    tensors = [("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_)),
               ("stream", "BOOL", np.array([stream])), ("exclude_input_in_output", "BOOL", np.array([exclude]))]
    if sampling is not None:
        text = sampling if isinstance(sampling, str) else json.dumps(sampling)
        tensors.append(("sampling_parameters", "BYTES", np.array([text.encode()], dtype=np.object_)))
    inputs = []
    for name, datatype, data in tensors:
        tensor = InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs
