from __future__ import annotations

from adapters.identity import AdapterIdentity
from engine.adapter_ids import AdapterIds, engine_lora_name


def ident(name: str, content_hash: str) -> AdapterIdentity:
    return AdapterIdentity(name, 1, content_hash)


def test_adapter_ids_stable_per_name_and_hash():
    ids, other = AdapterIds(), AdapterIds()
    a = ids.id_for(ident("a", "h1"))
    assert a == ids.id_for(ident("a", "h1")) == other.id_for(ident("a", "h1"))
    assert ids.id_for(ident("a", "h2")) != a
    assert ids.id_for(ident("b", "h1")) != a
    assert a > 0


def test_adapter_ids_never_collide():
    ids = AdapterIds()
    values = [ids.id_for(ident(f"name{i}", "hash")) for i in range(2000)]
    assert len(set(values)) == 2000


def test_engine_lora_name_carries_the_hash():
    assert engine_lora_name(ident("poet", "ab" * 32)) != engine_lora_name(ident("poet", "cd" * 32))


def test_a_new_version_with_the_same_content_keeps_its_engine_identity():
    """The engine caches by content: re-publishing the same bytes as a new version reuses what is loaded."""
    ids = AdapterIds()
    assert ids.id_for(AdapterIdentity("a", 1, "h")) == ids.id_for(AdapterIdentity("a", 2, "h"))
