from __future__ import annotations

import pytest

from adapters.store import BlobNotFound, LocalStore, S3Store, UnsafeKey, open_store, safe_key


@pytest.mark.parametrize("key", ["a", "a/b", "sql-helper/1/adapter_model.safetensors", "A.b_c-d/e"])
def test_safe_keys(key):
    assert safe_key(key) == key


@pytest.mark.parametrize("key", [
    "", "/abs", "../x", "a/../b", "..", ".", "a/./b", "a//b", "a/", "a\\b", "a\0b", ".hidden", "a/.tmp",
    "a b", "caf\u00e9", "x" * 2000, "C:/x", "a\n", "a/b\n",
])
def test_unsafe_keys(key):
    with pytest.raises(UnsafeKey):
        safe_key(key)


def _src(tmp_path, data=b"payload", name="src.bin"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _round_trip(store, tmp_path):
    store.put_file("n/1/a.bin", _src(tmp_path, b"one"))
    store.put_file("n/1/b.bin", _src(tmp_path, b"two"))
    store.put_file("n/10/a.bin", _src(tmp_path, b"sibling"))
    store.put_file("n/1/a.bin", _src(tmp_path, b"one again"))
    assert store.exists("n/1/a.bin") and not store.exists("n/2/a.bin")
    store.get_file("n/1/a.bin", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"one again"
    with pytest.raises(BlobNotFound):
        store.get_file("n/2/a.bin", tmp_path / "missing")
    # A folder prefix: n/1 must not take n/10 with it.
    store.delete_prefix("n/1")
    assert not store.exists("n/1/a.bin") and not store.exists("n/1/b.bin")
    assert store.exists("n/10/a.bin")
    store.delete_prefix("nothing/here")
    for key in ("../x", "/abs", "n/../../x"):
        with pytest.raises(UnsafeKey):
            store.put_file(key, _src(tmp_path))
        with pytest.raises(UnsafeKey):
            store.get_file(key, tmp_path / "x")
        with pytest.raises(UnsafeKey):
            store.exists(key)
        with pytest.raises(UnsafeKey):
            store.delete_prefix(key)


def test_local_round_trip(tmp_path):
    store = LocalStore(tmp_path / "blobs")
    assert not (tmp_path / "blobs").exists() and not store.exists("n/1/a.bin")  # created by the first write
    _round_trip(store, tmp_path)
    leftovers = [p.name for p in (tmp_path / "blobs").rglob("*") if p.name.startswith(".")]
    assert leftovers == []
    assert not (tmp_path / "x").exists()
    assert store.uri == (tmp_path / "blobs").resolve().as_uri()


def test_local_store_refuses_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    root = tmp_path / "blobs"
    root.mkdir()
    store = LocalStore(root)
    (root / "n").symlink_to(outside)
    (root / "file").symlink_to(outside / "secret")
    with pytest.raises(UnsafeKey, match="symlink"):
        store.get_file("n/secret", tmp_path / "got")
    with pytest.raises(UnsafeKey, match="symlink"):
        store.put_file("n/new", _src(tmp_path))
    with pytest.raises(UnsafeKey, match="symlink"):
        store.get_file("file", tmp_path / "got")
    with pytest.raises(UnsafeKey, match="symlink"):
        store.delete_prefix("n")
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]


def test_s3_round_trip(s3_bucket, tmp_path):
    store = open_store(f"s3://{s3_bucket}/registry/blobs")
    assert isinstance(store, S3Store) and store.uri == f"s3://{s3_bucket}/registry/blobs"
    _round_trip(store, tmp_path)


def test_s3_explicit_endpoint_and_many_objects(s3_bucket, s3_endpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    store = S3Store(s3_bucket, endpoint_url=s3_endpoint)
    src = _src(tmp_path)
    for i in range(25):
        store.put_file(f"big/1/f{i}", src)
    store.put_file("big/2/keep", src)
    store.delete_prefix("big/1")
    assert not store.exists("big/1/f0") and not store.exists("big/1/f24")
    assert store.exists("big/2/keep")


@pytest.mark.parametrize("uri,kind,where", [
    ("s3://bucket-a/some/prefix", S3Store, ("bucket-a", "some/prefix")),
    ("s3://bucket-a", S3Store, ("bucket-a", "")),
    ("file:///TMP/store", LocalStore, "store"),
    ("TMP/plain", LocalStore, "plain"),
])
def test_open_store(uri, kind, where, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = open_store(uri.replace("TMP", str(tmp_path).lstrip("/") if uri.startswith("file") else str(tmp_path)))
    assert isinstance(store, kind)
    if kind is S3Store:
        assert (store.bucket, store.prefix) == where
    else:
        assert store.root == (tmp_path / where).resolve()


@pytest.mark.parametrize("uri,fragment", [
    ("gs://bucket/x", "known schemes: ['file', 's3']"),
    ("s3://Bad_Bucket/x", "bucket name"),
    ("s3://bucket-a/../x", "'..'"),
    ("file://remotehost/x", "names a host"),
])
def test_open_store_rejects(uri, fragment, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        open_store(uri)
