from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from adapters.index import AliasInUse, NothingToRollBack, RegistryIndex, VersionNotFound
from adapters.manifest import Manifest, ManifestFile, utc_now

REPO = Path(__file__).resolve().parents[2]


def manifest(name: str, content: str) -> Manifest:
    digest = hashlib.sha256(content.encode()).hexdigest()
    return Manifest(name=name, version=1, files=(ManifestFile(path="adapter_config.json", sha256=digest, size=1),),
                    content_hash=digest, peft_type="LORA", rank=8, alpha=16, target_modules=("q_proj",),
                    base_model_id="m", size_bytes=1, created_at=utc_now())


@pytest.fixture
def index(database_url):
    with RegistryIndex(database_url) as idx:
        yield idx


def push(index: RegistryIndex, name: str, *contents: str) -> list[int]:
    return [index.add_version(manifest(name, c)).version for c in contents]


def test_versions_are_allocated_in_order(index):
    assert push(index, "a", "v1", "v2", "v3") == [1, 2, 3]
    assert push(index, "b", "v1") == [1]
    assert [m.version for m in index.versions("a")] == [1, 2, 3]
    assert index.latest("a").content_hash == manifest("a", "v3").content_hash
    assert index.names() == ["a", "b"]
    assert index.get("a", 2).content_hash == manifest("a", "v2").content_hash


def test_identical_content_returns_newest(index):
    push(index, "a", "v1", "v2")
    assert index.add_version(manifest("a", "v2")).version == 2
    # Identity is checked against the newest version only: old content comes back as a new version.
    assert index.add_version(manifest("a", "v1")).version == 3


def test_reservations_are_invisible_and_numbers_never_reused(index):
    push(index, "a", "v1")
    reservation = index.reserve_version("a", manifest("a", "v2").content_hash)
    assert reservation.version == 2 and reservation.existing is None
    assert [m.version for m in index.versions("a")] == [1]
    index.release_version("a", 2)
    assert push(index, "a", "v2") == [3]


def test_stable_is_the_first_version_until_promoted(index):
    push(index, "a", "v1", "v2")
    assert index.alias_target("a", "stable") == 1  # a new version never changes what serves
    index.set_alias("a", "stable", 2)
    push(index, "a", "v3")
    assert index.alias_target("a", "stable") == 2 and index.is_explicit("a", "stable")
    index.set_alias("a", "beta", 3)
    assert index.aliases("a") == {"beta": 3, "stable": 2}


def test_rollback_walks_back_through_history(index):
    push(index, "a", "v1", "v2", "v3")
    index.set_alias("a", "stable", 2)
    index.set_alias("a", "stable", 3)
    assert index.rollback("a") == 2
    push(index, "a", "v4")  # a push never moves stable
    assert index.alias_target("a", "stable") == 2
    assert index.rollback("a") == 1
    with pytest.raises(NothingToRollBack, match="no earlier target"):
        index.rollback("a")
    index.set_alias("a", "stable", 4)
    assert index.rollback("a") == 1
    with pytest.raises(VersionNotFound, match="no alias 'beta'"):
        index.rollback("a", "beta")


def test_delete_refused_while_an_alias_points_at_it(index):
    push(index, "a", "v1", "v2", "v3")
    index.set_alias("a", "stable", 3)
    index.set_alias("a", "canary", 3)
    with pytest.raises(AliasInUse, match="alias canary, stable"):
        index.delete_version("a", 3)
    index.set_alias("a", "stable", 2)
    index.set_alias("a", "canary", 2)
    index.delete_version("a", 3)
    assert [m.version for m in index.versions("a")] == [1, 2]
    with pytest.raises(VersionNotFound):
        index.delete_version("a", 3)
    assert push(index, "a", "v5") == [4]
    # History entries of a deleted version are gone, so rollback cannot land on it.
    index.delete_version("a", 1)
    with pytest.raises(NothingToRollBack):
        index.rollback("a", "canary")


@pytest.mark.parametrize("name,alias,version", [("../a", "stable", 1), ("a", "Bad Alias", 1), ("a", "stable", 0),
                                                ("a", "x/y", 1)])
def test_set_alias_validates(index, name, alias, version):
    push(index, "a", "v1")
    with pytest.raises(ValueError):
        index.set_alias(name, alias, version)


def test_set_alias_needs_an_existing_version(index):
    push(index, "a", "v1")
    with pytest.raises(VersionNotFound):
        index.set_alias("a", "stable", 7)


def test_another_connection_sees_new_versions(database_url):
    path = database_url
    with RegistryIndex(path) as reader, RegistryIndex(path) as writer:
        assert reader.names() == []
        push(writer, "a", "v1")
        assert reader.latest("a").version == 1
        writer.set_alias("a", "stable", 1)
        push(writer, "a", "v2")
        assert reader.alias_target("a", "stable") == 1 and [m.version for m in reader.versions("a")] == [1, 2]


def test_threads_allocate_distinct_versions(index):
    versions, errors = [], []

    def work(i: int) -> None:
        try:
            versions.extend(push(index, "a", *(f"t{i}-{j}" for j in range(5))))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(versions) == list(range(1, 21))


def test_processes_allocate_distinct_versions(database_url):
    path = database_url
    RegistryIndex(path).close()
    script = (
        "import sys; from tests.adapters.test_index import manifest, push; from adapters.index import RegistryIndex\n"
        "idx = RegistryIndex(sys.argv[1])\n"
        "print(' '.join(map(str, push(idx, 'a', *(sys.argv[2] + str(j) for j in range(10))))))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), tag], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env=env) for tag in ("p", "q")]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    versions = sorted(int(v) for out in outputs for v in out.split())
    assert versions == list(range(1, 21))
    with RegistryIndex(path) as idx:
        # The first version published became stable (which one, the two processes' order decides: 2 may commit
        # before 1) and none of the 19 published after it moved it.
        assert idx.alias_target("a", "stable") in versions
        assert idx.previous_target("a") is None and not idx.is_explicit("a", "stable")
