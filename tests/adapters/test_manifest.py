from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from adapters.identity import content_hash
from adapters.manifest import Manifest, blob_key, build_manifest
from adapters.validation import ValidationLimits, validate_adapter_dir


@pytest.fixture
def manifest(copy_adapter, base_spec):
    folder = copy_adapter("support-bot")
    facts = validate_adapter_dir("support-bot", folder, base_spec, ValidationLimits(64, 10 ** 7))
    return folder, build_manifest("support-bot", 3, "helps", folder, facts, base_spec.model_id)


def test_build_manifest(manifest, base_model_id):
    folder, m = manifest
    assert m.content_hash == content_hash(folder)
    assert [f.path for f in m.files] == ["adapter_config.json", "adapter_model.safetensors"]
    for file in m.files:
        data = (folder / file.path).read_bytes()
        assert (file.size, file.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert m.size_bytes == sum(f.size for f in m.files)
    assert (m.name, m.version, m.rank, m.alpha, m.base_model_id) == ("support-bot", 3, 16, 16.0, base_model_id)
    assert m.target_modules == ("k_proj", "o_proj", "q_proj", "v_proj")
    assert m.created_at.endswith("Z")
    assert blob_key(m, m.files[1]) == "support-bot/3/adapter_model.safetensors"


def test_json_round_trip(manifest):
    _, m = manifest
    assert Manifest.model_validate_json(m.model_dump_json()) == m


@pytest.mark.parametrize("field,value", [
    ("name", "../x"),
    ("name", "A"),
    ("version", 0),
    ("version", -1),
    ("content_hash", "abc"),
    ("created_at", "2024-01-01T00:00:00"),
    ("created_at", "2024-01-01T00:00:00+02:00"),
    ("created_at", "yesterday"),
    ("target_modules", []),
    ("files", []),
])
def test_invalid_fields_rejected(manifest, field, value):
    _, m = manifest
    with pytest.raises(ValidationError):
        Manifest.model_validate({**m.model_dump(), field: value})


@pytest.mark.parametrize("path", ["../x", "a/b", "/etc/passwd", "", ".hidden", "a\\b"])
def test_file_paths_are_single_safe_names(manifest, path):
    _, m = manifest
    files = [{**m.files[0].model_dump(), "path": path}, m.files[1].model_dump()]
    with pytest.raises(ValidationError):
        Manifest.model_validate({**m.model_dump(), "files": files})


def test_duplicate_file_paths_rejected(manifest):
    _, m = manifest
    with pytest.raises(ValidationError, match="unique"):
        Manifest.model_validate({**m.model_dump(), "files": [m.files[0].model_dump()] * 2})
