"""Names, references and the content hash that identifies an adapter version."""

from __future__ import annotations

import shutil

import pytest

from adapters.identity import AdapterIdentity, ModelRef, content_hash, parse_model_ref, version_label


@pytest.mark.parametrize("ref,expected", [
    ("sql-helper", ModelRef("sql-helper")),
    ("sql-helper@1", ModelRef("sql-helper", version=1)),
    ("a.b_c-9@120", ModelRef("a.b_c-9", version=120)),
    ("sql-helper:stable", ModelRef("sql-helper", alias="stable")),
    ("x:canary-2", ModelRef("x", alias="canary-2")),
])
def test_parse_model_ref(ref, expected):
    assert parse_model_ref(ref) == expected
    assert str(expected) == ref


@pytest.mark.parametrize("ref", [
    "", "a@", "a@b@c", "a@0", "a@-1", "a@01", "a@1.5", "a@ 1", "../x", "a/b", "/abs", "a:", "a:Stable",
    "a:b/c", "a:../x", "a:1x", "a@1:b", "A", "a b", "@1", ":stable", "a\0", None, "a\n", "a@1\n", "a:b\n",
])
def test_parse_model_ref_rejects(ref):
    with pytest.raises(ValueError):
        parse_model_ref(ref)


def test_one_spelling_of_name_at_version():
    identity = AdapterIdentity("poet", 3, "ab" * 32)
    assert identity.label == version_label("poet", 3) == str(ModelRef("poet", version=3)) == "poet@3"


@pytest.fixture
def adapter_dir(demo_assets, tmp_path):
    target = tmp_path / "a"
    shutil.copytree(demo_assets.adapter_dirs["poet"], target)
    return target


def test_hash_changes_with_weights_not_readme(adapter_dir):
    before = content_hash(adapter_dir)
    (adapter_dir / "README.md").write_text("changed")
    assert content_hash(adapter_dir) == before
    weights = adapter_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert content_hash(adapter_dir) != before
