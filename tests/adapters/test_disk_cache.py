from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from adapters.disk_cache import AdapterDiskCache, CacheIntegrityError
from adapters.manifest import Manifest, blob_key, build_manifest
from adapters.store import LocalStore
from adapters.validation import AdapterFacts

KIB = 1024
FACTS = AdapterFacts(peft_type="LORA", rank=8, alpha=16.0, target_modules=("q_proj",), size_bytes=0, num_tensors=2)


class CountingStore(LocalStore):
    def __init__(self, root: Path):
        super().__init__(root)
        self.gets = 0

    def get_file(self, key: str, dest: Path) -> None:
        self.gets += 1
        super().get_file(key, dest)


@pytest.fixture
def store(tmp_path) -> CountingStore:
    return CountingStore(tmp_path / "blobs")


@pytest.fixture
def publish(store, tmp_path):
    """Store a synthetic version of `size` KiB (the cache moves bytes; it does not parse adapters)."""

    def make(name: str, version: int = 1, size_kib: int = 10) -> Manifest:
        folder = tmp_path / "src" / f"{name}-{version}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(f'{{"name": "{name}", "v": {version}}}')
        (folder / "adapter_model.safetensors").write_bytes(os.urandom(size_kib * KIB))
        manifest = build_manifest(name, version, "", folder, FACTS, "m")
        for file in manifest.files:
            store.put_file(blob_key(manifest, file), folder / file.path)
        return manifest

    return make


def test_miss_then_hit(tmp_path, store, publish):
    m = publish("a")
    cache = AdapterDiskCache(tmp_path / "cache", 1024 * KIB, store)
    path, hit = cache.fetch(m)
    assert not hit and path == (tmp_path / "cache").resolve() / "a" / f"1-{m.content_hash[:16]}"
    assert cache.fetch(m) == (path, True)
    assert cache.contains(m) and store.gets == 2
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.num_entries) == (1, 1, 0, 1)
    assert stats.total_bytes == m.size_bytes


def test_lru_eviction_under_budget(tmp_path, store, publish):
    a, b, c = publish("a"), publish("b"), publish("c")
    evicted = []
    # Room for two 10 KiB adapters, not three.
    cache = AdapterDiskCache(tmp_path / "cache", 25 * KIB, store, on_evict=evicted.append)
    cache.fetch(a)
    cache.fetch(b)
    cache.fetch(a)  # a is now more recent than b
    result = cache.fetch_detailed(c)
    assert [e.label for e in result.evicted] == ["b@1"] and [e.label for e in evicted] == ["b@1"]
    assert [e.name for e in cache.entries()] == ["a", "c"]
    assert not (tmp_path / "cache" / "b").exists()
    assert cache.stats().evictions == 1 and cache.stats().total_bytes <= 25 * KIB


def test_pinned_names_are_never_evicted(tmp_path, store, publish):
    a, b, c = publish("a"), publish("b"), publish("c")
    cache = AdapterDiskCache(tmp_path / "cache", 25 * KIB, store)
    cache.pin("a")
    cache.pin("a")
    cache.unpin("a")  # pins nest: still pinned once
    cache.fetch(a)
    cache.fetch(b)
    assert [e.label for e in cache.fetch_detailed(c).evicted] == ["b@1"]
    cache.unpin("a")
    assert not cache.is_pinned("a")
    assert [e.label for e in cache.fetch_detailed(b).evicted] == ["a@1"]


def test_an_adapter_larger_than_the_budget_is_kept(tmp_path, store, publish):
    small, big = publish("small", size_kib=5), publish("big", size_kib=50)
    cache = AdapterDiskCache(tmp_path / "cache", 20 * KIB, store)
    cache.fetch(small)
    assert [e.label for e in cache.fetch_detailed(big).evicted] == ["small@1"]
    assert [e.name for e in cache.entries()] == ["big"]


def test_explicit_evict(tmp_path, store, publish):
    m = publish("a")
    cache = AdapterDiskCache(tmp_path / "cache", 1024 * KIB, store)
    path, _ = cache.fetch(m)
    cache.pin("a")
    assert cache.evict(m) is True and not path.exists()
    assert cache.evict(m) is False and not cache.contains(m)


def test_restart_rebuilds_lru_order_from_mtimes(tmp_path, store, publish):
    a, b, c = publish("a"), publish("b"), publish("c")
    root = tmp_path / "cache"
    first = AdapterDiskCache(root, 1024 * KIB, store)
    paths = {m.name: first.fetch(m)[0] for m in (a, b, c)}
    for age, name in enumerate(("b", "c", "a")):  # b oldest, a newest
        os.utime(paths[name], (1_000_000 + age, 1_000_000 + age))
    (root / ".tmp" / "leftover").mkdir(parents=True)
    second = AdapterDiskCache(root, 25 * KIB, store)
    assert [e.name for e in second.entries()] == ["b", "c", "a"]
    assert not (root / ".tmp" / "leftover").exists()
    assert second.fetch(a)[1] is True
    gets = store.gets
    d = publish("d")
    assert [e.label for e in second.fetch_detailed(d).evicted] == ["b@1", "c@1"]
    assert store.gets == gets + 2


@pytest.mark.parametrize("corrupt,fragment", [
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])),
     "file adapter_model.safetensors has sha256"),
    (lambda p: p.write_bytes(p.read_bytes() + b"x"), "file adapter_model.safetensors has 10241 bytes"),
    (lambda p: p.unlink(), "file adapter_model.safetensors is missing from the store"),
])
def test_corrupted_blob_is_detected_and_nothing_kept(tmp_path, store, publish, corrupt, fragment):
    m = publish("a")
    corrupt(store.root / blob_key(m, m.files[1]))
    cache = AdapterDiskCache(tmp_path / "cache", 1024 * KIB, store)
    with pytest.raises(CacheIntegrityError, match=fragment):
        cache.fetch(m)
    assert not cache.contains(m) and cache.entries() == []
    assert list((tmp_path / "cache").rglob("*.safetensors")) == []


def test_forged_manifest_content_hash_is_detected(tmp_path, store, publish):
    m = publish("a")
    forged = m.model_copy(update={"content_hash": "0" * 64})
    cache = AdapterDiskCache(tmp_path / "cache", 1024 * KIB, store)
    with pytest.raises(CacheIntegrityError, match="content hash"):
        cache.fetch(forged)
    assert cache.entries() == []


def test_concurrent_fetches_download_once(tmp_path, store, publish):
    m = publish("a", size_kib=512)
    cache = AdapterDiskCache(tmp_path / "cache", 4096 * KIB, store)
    results, start = [], threading.Barrier(6)

    def fetch() -> None:
        start.wait()
        results.append(cache.fetch(m))

    threads = [threading.Thread(target=fetch) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.gets == len(m.files)
    assert sorted(hit for _, hit in results) == [False] + [True] * 5
    assert len({path for path, _ in results}) == 1
