"""The header of a .safetensors file, read without loading any tensor.

Layout: an 8-byte little-endian u64 N, then N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {str: str}}`, then the data
region. Offsets are relative to the start of the data region; the tensors must tile it exactly.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER_BYTES = 100 * 1024 * 1024
METADATA_KEY = "__metadata__"
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


class SafetensorsHeaderError(ValueError):
    """Every problem found in one header; structural problems (length, JSON) stop the reading early."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """The tensors described by the header of `path`, in data order; raises SafetensorsHeaderError."""
    try:
        with path.open("rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise SafetensorsHeaderError([f"file is {file_size} bytes, too short for a header length"])
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise SafetensorsHeaderError([f"header length {header_len} exceeds {MAX_HEADER_BYTES} bytes"])
            if 8 + header_len > file_size:
                raise SafetensorsHeaderError(
                    [f"header length {header_len} runs past the end of the {file_size}-byte file"])
            raw = f.read(header_len)
    except OSError as e:
        raise SafetensorsHeaderError([f"cannot read: {e.strerror or e}"]) from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsHeaderError([f"header is not valid JSON: {e}"]) from e
    if not isinstance(header, dict):
        raise SafetensorsHeaderError([f"header must be a JSON object, got {type(header).__name__}"])
    return parse_header(header, data_len=file_size - 8 - header_len)


def parse_header(header: dict, data_len: int) -> list[TensorInfo]:
    """Check a decoded header against a data region of `data_len` bytes; reports every problem."""
    problems: list[str] = []
    metadata = header.get(METADATA_KEY, {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        problems.append(f"{METADATA_KEY} must map strings to strings")
    spans: list[tuple[int, int, TensorInfo]] = []
    for name, entry in header.items():
        if name == METADATA_KEY:
            continue
        parsed = _parse_entry(name, entry, data_len, problems)
        if parsed is not None:
            spans.append(parsed)
    if problems:
        # Coverage is only meaningful once every entry is readable.
        raise SafetensorsHeaderError(problems)
    spans.sort(key=lambda span: (span[0], span[1]))
    position = 0
    for begin, end, info in spans:
        if begin < position:
            problems.append(f"tensor {info.name} data [{begin}, {end}) overlaps the previous tensor")
        elif begin > position:
            problems.append(f"{begin - position} bytes before tensor {info.name} belong to no tensor")
        position = max(position, end)
    if not problems and position != data_len:
        problems.append(f"tensors cover {position} bytes of a {data_len}-byte data region")
    if problems:
        raise SafetensorsHeaderError(problems)
    return [info for _, _, info in spans]


def _parse_entry(name: str, entry: object, data_len: int,
                 problems: list[str]) -> tuple[int, int, TensorInfo] | None:
    if not isinstance(entry, dict):
        problems.append(f"tensor {name}: entry must be an object")
        return None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    found = len(problems)
    if dtype not in DTYPE_BYTES:
        problems.append(f"tensor {name}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        problems.append(f"tensor {name}: shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        problems.append(f"tensor {name}: data_offsets must be [begin, end], got {offsets!r}")
    if len(problems) > found:
        return None
    begin, end = offsets
    if not begin <= end <= data_len:
        problems.append(f"tensor {name}: data_offsets [{begin}, {end}] outside the {data_len}-byte data region")
        return None
    nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - begin != nbytes:
        problems.append(f"tensor {name}: {dtype} {shape} needs {nbytes} bytes, data_offsets span {end - begin}")
        return None
    return begin, end, TensorInfo(name=name, dtype=dtype, shape=tuple(shape), nbytes=nbytes)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
