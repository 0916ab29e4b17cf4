"""File contents in a blob store (the data home's folder or S3), keyed by file id; metadata in the batch store."""

from __future__ import annotations

import tempfile
from pathlib import Path

from adapters.store import BlobNotFound, BlobStore

PREFIX = "files"


def _key(file_id: str) -> str:
    # A folder per file: `delete_prefix` removes folders, in a local store and in S3 alike.
    return f"{PREFIX}/{file_id}/content"


class FileBlobs:
    def __init__(self, store: BlobStore):
        self.store = store

    def put(self, file_id: str, content: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "content"
            path.write_bytes(content)
            self.store.put_file(_key(file_id), path)

    def get(self, file_id: str) -> bytes:
        """Raises BlobNotFound when the content is gone."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "content"
            self.store.get_file(_key(file_id), path)
            return path.read_bytes()

    def delete(self, file_id: str) -> None:
        self.store.delete_prefix(f"{PREFIX}/{file_id}")


__all__ = ["BlobNotFound", "FileBlobs"]
