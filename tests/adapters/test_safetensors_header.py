from __future__ import annotations

import json
import struct

import pytest

from adapters.safetensors_header import MAX_HEADER_BYTES, SafetensorsHeaderError, read_safetensors_header


def _file(tmp_path, header, data_len: int, header_len: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "w.safetensors"
    length = len(raw) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", length) + raw + b"\0" * data_len)
    return path


def _entry(dtype="F32", shape=(2, 2), offsets=(0, 16)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def test_reads_real_adapter_header(demo_assets):
    path = demo_assets.adapter_dirs["sql-helper"] / "adapter_model.safetensors"
    tensors = read_safetensors_header(path)
    # 4 layers x (q_proj, v_proj) x (A, B)
    assert len(tensors) == 16
    by_name = {t.name: t for t in tensors}
    a = by_name["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = by_name["base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight"]
    assert (a.dtype, a.shape, a.nbytes) == ("F32", (8, 256), 8 * 256 * 4)
    assert b.shape == (128, 8)
    header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert sum(t.nbytes for t in tensors) == path.stat().st_size - 8 - header_len


def test_valid_synthetic_header_with_metadata(tmp_path):
    header = {"__metadata__": {"format": "pt"}, "b": _entry(offsets=(16, 32)), "a": _entry()}
    tensors = read_safetensors_header(_file(tmp_path, header, 32))
    assert [t.name for t in tensors] == ["a", "b"]


@pytest.mark.parametrize("header,data_len,header_len,fragment", [
    (b"", 0, None, "header is not valid JSON"),
    (b"{not json", 0, None, "not valid JSON"),
    (b"\xff\xfe", 0, None, "not valid JSON"),
    (b"[1, 2]", 0, None, "must be a JSON object"),
    (b"{}", 0, MAX_HEADER_BYTES + 1, "exceeds"),
    (b"{}", 0, 4096, "runs past the end"),
    ({"a": _entry(dtype="F33")}, 16, None, "unknown dtype 'F33'"),
    ({"a": _entry(shape=(2, -1))}, 16, None, "shape must be a list of non-negative integers"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0]}}, 16, None, "data_offsets must be [begin, end]"),
    ({"a": _entry(offsets=(0, 32))}, 16, None, "outside the 16-byte data region"),
    ({"a": _entry(offsets=(0, 12))}, 16, None, "needs 16 bytes, data_offsets span 12"),
    ({"a": _entry(), "b": _entry(offsets=(8, 24))}, 24, None, "overlaps the previous tensor"),
    ({"a": _entry(), "b": _entry(offsets=(20, 36))}, 36, None, "4 bytes before tensor b belong to no tensor"),
    ({"a": _entry()}, 20, None, "tensors cover 16 bytes of a 20-byte data region"),
    ({"__metadata__": {"format": 1}, "a": _entry()}, 16, None, "__metadata__ must map strings to strings"),
    ({"a": [1]}, 16, None, "entry must be an object"),
])
def test_bad_headers(tmp_path, header, data_len, header_len, fragment):
    with pytest.raises(SafetensorsHeaderError) as info:
        read_safetensors_header(_file(tmp_path, header, data_len, header_len))
    assert fragment in str(info.value)


def test_too_short_file(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(SafetensorsHeaderError, match="too short"):
        read_safetensors_header(path)


def test_every_entry_problem_reported(tmp_path):
    header = {"a": _entry(dtype="X"), "b": _entry(shape=(3,)), "c": _entry(offsets=(0, 99))}
    with pytest.raises(SafetensorsHeaderError) as info:
        read_safetensors_header(_file(tmp_path, header, 16))
    assert len(info.value.problems) == 3
    assert isinstance(info.value, ValueError)
