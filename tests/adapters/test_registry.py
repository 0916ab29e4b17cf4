from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from adapters.disk_cache import AdapterDiskCache
from adapters.identity import content_hash, parse_model_ref
from adapters.index import AliasInUse, RegistryError, RegistryIndex
from adapters.registry import AdapterIncompatible, AdapterNotFound, Registry, RegistryConfig
from adapters.store import LocalStore, open_store
from adapters.validation import AdapterValidationError, ValidationLimits, validate_adapter_dir

LIMITS = ValidationLimits(max_lora_rank=64, max_bytes=10 * 1024 * 1024)
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.fixture
def registry(tmp_path, base_spec):
    reg = Registry(RegistryIndex(tmp_path / "index.sqlite"), LocalStore(tmp_path / "blobs"), base_spec, LIMITS)
    yield reg
    reg.close()


def _changed(folder: Path, rewrite_tensors) -> Path:
    rewrite_tensors(folder, lambda t: {**t, Q_A: t[Q_A] + 1})
    return folder


def test_push_versions_and_dedupe(registry, copy_adapter, rewrite_tensors, tmp_path):
    folder = copy_adapter("sql-helper")
    first, created = registry.push_with_status(folder, "sql-helper", "writes SQL")
    assert (first.label, created) == ("sql-helper@1", True)
    assert first.content_hash == content_hash(folder)
    again, created = registry.push_with_status(copy_adapter("sql-helper"), "sql-helper")
    assert (again, created) == (first, False)
    second = registry.push(_changed(folder, rewrite_tensors), "sql-helper")
    assert second.version == 2 and second.content_hash != first.content_hash
    assert registry.resolve(parse_model_ref("sql-helper")) == first  # published, not serving: stable stays
    assert registry.resolve(parse_model_ref("sql-helper@2")) == second
    for version in (1, 2):
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            assert registry.store.exists(f"sql-helper/{version}/{name}")
    [summary] = registry.list()
    assert (summary.name, summary.description, summary.aliases) == ("sql-helper", "writes SQL", {"stable": 1})
    assert [m.version for m in summary.versions] == [1, 2]


@pytest.fixture
def published(registry, copy_adapter, rewrite_tensors):
    folder = copy_adapter("sql-helper")
    registry.push(folder, "sql-helper")
    registry.push(_changed(folder, rewrite_tensors), "sql-helper")
    registry.push(_changed(folder, rewrite_tensors), "sql-helper")
    registry.promote("sql-helper", 2)
    registry.promote("sql-helper", 1, alias="beta")
    return registry


@pytest.mark.parametrize("ref,version", [
    ("sql-helper", 2), ("sql-helper@1", 1), ("sql-helper@3", 3), ("sql-helper:stable", 2), ("sql-helper:beta", 1),
])
def test_resolve(published, ref, version):
    assert published.resolve(parse_model_ref(ref)).version == version


@pytest.mark.parametrize("ref,message", [
    ("nope", "adapter 'nope' not found"),
    ("sql-helper@9", "adapter 'sql-helper@9' not found"),
    ("sql-helper:gamma", "adapter 'sql-helper' has no alias 'gamma'"),
    ("nope:stable", "adapter 'nope' has no alias 'stable'"),
])
def test_resolve_not_found_names_the_ref_only(published, tmp_path, ref, message):
    with pytest.raises(AdapterNotFound) as info:
        published.resolve(parse_model_ref(ref))
    assert str(info.value) == message
    assert str(tmp_path) not in str(info.value)


def test_resolve_refuses_another_base_model(published, base_spec):
    other = Registry(published.index, published.store, replace(base_spec, model_id="other/model"), LIMITS)
    with pytest.raises(AdapterIncompatible, match="base model 'loraplex/tiny-llama', not 'other/model'"):
        other.resolve(parse_model_ref("sql-helper"))
    assert other.show(parse_model_ref("sql-helper")).manifest.version == 2


def test_show(published):
    detail = published.show(parse_model_ref("sql-helper:beta"))
    assert detail.manifest.version == 1
    assert detail.versions == [1, 2, 3] and detail.aliases == {"beta": 1, "stable": 2}


def test_rollback_and_delete(published):
    with pytest.raises(AliasInUse, match="sql-helper@2 is the target of alias stable") as info:
        published.delete("sql-helper", 2)
    assert isinstance(info.value, RegistryError)
    published.delete("sql-helper", 3)
    assert not published.store.exists("sql-helper/3/adapter_model.safetensors")
    assert published.store.exists("sql-helper/2/adapter_model.safetensors")
    with pytest.raises(AdapterNotFound):
        published.resolve(parse_model_ref("sql-helper@3"))
    with pytest.raises(AdapterNotFound):
        published.delete("sql-helper", 3)
    # stable went 1 -> 2 -> 3 by pushes, then was promoted to 2; version 3 is gone, so back to 1.
    assert published.rollback("sql-helper").version == 1
    assert published.resolve(parse_model_ref("sql-helper")).version == 1


@pytest.mark.parametrize("call", [
    lambda r: r.resolve(parse_model_ref("../x")),
    lambda r: r.resolve(parse_model_ref("a/b")),
    lambda r: r.resolve(parse_model_ref("/etc/passwd")),
    lambda r: r.show(parse_model_ref("sql-helper:../x")),
    lambda r: r.promote("../x", 1),
    lambda r: r.promote("sql-helper", 1, alias="../x"),
    lambda r: r.promote("sql-helper", 0),
    lambda r: r.rollback("a/b"),
    lambda r: r.delete("../sql-helper", 1),
    lambda r: r.delete("sql-helper", -1),
])
def test_path_escapes_rejected(published, call):
    with pytest.raises(ValueError):
        call(published)


def test_push_with_escaping_name_writes_nothing(registry, copy_adapter, tmp_path):
    with pytest.raises(AdapterValidationError, match="name '../evil' must match"):
        registry.push(copy_adapter("sql-helper"), "../evil")
    assert not (tmp_path / "evil").exists()
    assert registry.index.names() == [] and not (tmp_path / "blobs").exists()


def test_invalid_push_records_nothing(registry, copy_adapter, edit_config, tmp_path):
    folder = copy_adapter("sql-helper")
    edit_config(folder, r=128, peft_type="IA3")
    with pytest.raises(AdapterValidationError) as info:
        registry.push(folder, "sql-helper")
    assert len(info.value.problems) == 3  # peft_type, rank above max, tensors' rank disagrees
    assert registry.index.names() == [] and not (tmp_path / "blobs").exists()


class FailingStore(LocalStore):
    def put_file(self, key: str, src: Path) -> None:
        if key.endswith(".safetensors"):
            raise OSError("disk full")
        super().put_file(key, src)


def test_failed_upload_leaves_no_version_and_no_blobs(tmp_path, base_spec, copy_adapter):
    registry = Registry(RegistryIndex(tmp_path / "index.sqlite"), FailingStore(tmp_path / "blobs"), base_spec, LIMITS)
    with pytest.raises(OSError, match="disk full"):
        registry.push(copy_adapter("sql-helper"), "sql-helper")
    assert registry.index.names() == []
    assert not registry.store.exists("sql-helper/1/adapter_config.json")
    registry.store = LocalStore(tmp_path / "blobs")
    assert registry.push(copy_adapter("sql-helper"), "sql-helper").version == 2  # 1 was reserved, then released


def test_push_to_s3_then_fetch_through_disk_cache(s3_bucket, tmp_path, base_spec, copy_adapter):
    config = RegistryConfig(store_uri=f"s3://{s3_bucket}/adapters", index_url=str(tmp_path / "index.sqlite"),
                            disk_cache_dir=str(tmp_path / "cache"))
    registry = Registry.from_config(config, base_spec, max_lora_rank=64)
    folder = copy_adapter("poet")
    pushed = registry.push(folder, "poet")
    cache = AdapterDiskCache(config.resolved_disk_cache_dir(), config.disk_cache_bytes,
                             open_store(config.resolved_store_uri()))
    path, hit = cache.fetch(registry.resolve(parse_model_ref("poet")))
    assert not hit and path.name == f"1-{pushed.content_hash[:16]}"
    assert content_hash(path) == pushed.content_hash
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (path / name).read_bytes() == (folder / name).read_bytes()
    assert validate_adapter_dir("poet", path, base_spec, LIMITS).rank == 64
    assert cache.fetch(registry.resolve(parse_model_ref("poet@1"))) == (path, True)
    registry.close()


def test_config_defaults_live_under_data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPLEX_HOME", str(tmp_path))
    config = RegistryConfig()
    assert config.resolved_store_uri() == str(tmp_path / "registry" / "blobs")
    assert config.resolved_index_url() == str(tmp_path / "registry" / "index.sqlite")
    assert config.resolved_disk_cache_dir() == tmp_path / "cache" / "adapters"
    assert (config.max_adapter_bytes, config.disk_cache_bytes) == (512 * 2 ** 20, 2 * 2 ** 30)
    for name, field in RegistryConfig.model_fields.items():
        assert field.description, name


def test_other_dtypes_are_accepted(registry, copy_adapter, rewrite_tensors):
    folder = copy_adapter("sql-helper")
    rewrite_tensors(folder, lambda t: {k: v.to(torch.bfloat16) for k, v in t.items()})
    assert registry.push(folder, "sql-helper").version == 1
