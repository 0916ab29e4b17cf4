"""File contents in a local folder and in S3 (moto on loopback), through the same store interface."""

from __future__ import annotations

import pytest

from adapters.store import BlobNotFound, LocalStore, open_store
from api.batch.files import FileBlobs


@pytest.fixture(params=["local", "s3"])
def blobs(request, tmp_path) -> FileBlobs:
    if request.param == "local":
        return FileBlobs(LocalStore(tmp_path / "files"))
    return FileBlobs(open_store(f"s3://{request.getfixturevalue('s3_bucket')}/files-prefix"))


def test_put_get_delete(blobs):
    blobs.put("file-abc", b'{"a": 1}\n')
    blobs.put("file-def", b"other")
    assert blobs.get("file-abc") == b'{"a": 1}\n'
    blobs.delete("file-abc")
    with pytest.raises(BlobNotFound):
        blobs.get("file-abc")
    assert blobs.get("file-def") == b"other"
