"""Where adapter files live: one small interface, a local folder and S3 behind it, chosen by URI scheme.

Keys are relative POSIX paths checked by `safe_key` before any use, so no key can leave the store's root.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Components start with an alphanumeric, which rules out ".", ".." and the hidden names of temp files.
KEY_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_KEY_CHARS = 1024
BUCKET_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class BlobNotFound(LookupError):
    """No object under the key."""


class UnsafeKey(ValueError):
    """A key that could name something outside the store."""


def safe_key(key: str) -> str:
    """`key` if it is a relative POSIX path of safe components; raises UnsafeKey naming the problem."""
    if not isinstance(key, str) or not key:
        raise UnsafeKey("key must be a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise UnsafeKey(f"key is longer than {MAX_KEY_CHARS} characters")
    for bad, what in (("\0", "a NUL byte"), ("\\", "a backslash")):
        if bad in key:
            raise UnsafeKey(f"key {key!r} contains {what}")
    if key.startswith("/"):
        raise UnsafeKey(f"key {key!r} is absolute")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise UnsafeKey(f"key {key!r} has an empty, '.' or '..' component")
        if not KEY_PART.fullmatch(part):
            raise UnsafeKey(f"key {key!r} component {part!r} must match {KEY_PART.pattern}")
    return key


class BlobStore(ABC):
    """Flat object storage for adapter files."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """Where the store is, as `open_store` accepts it."""

    @abstractmethod
    def put_file(self, key: str, src: Path) -> None:
        """Store the bytes of `src` under `key`, replacing what was there; readers never see a partial file."""

    @abstractmethod
    def get_file(self, key: str, dest: Path) -> None:
        """Write the object under `key` to `dest`; raises BlobNotFound."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under the folder `prefix/` (not `prefix*`); nothing there is not an error."""


class LocalStore(BlobStore):
    """A folder, created by the first write. Symlinks inside it are never followed; writes go to a temp file
    renamed into place."""

    def __init__(self, root: Path):
        self.root = root.resolve()

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        path = self.root
        for part in safe_key(key).split("/"):
            path = path / part
            if path.is_symlink():
                raise UnsafeKey(f"key {key!r} runs through a symlink in the store; refusing to follow it")
        if not path.resolve().is_relative_to(self.root):
            raise UnsafeKey(f"key {key!r} resolves outside the store")
        return path

    def put_file(self, key: str, src: Path) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
        try:
            with src.open("rb") as source, temp.open("xb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
                target.flush()
                os.fsync(target.fileno())
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)

    def get_file(self, key: str, dest: Path) -> None:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError as e:
            raise BlobNotFound(key) from e
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                raise BlobNotFound(key)
            with dest.open("wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)

    def exists(self, key: str) -> bool:
        try:
            return stat.S_ISREG(self._path(key).lstat().st_mode)
        except FileNotFoundError:
            return False

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path)
        # Prune folders left empty, up to the root.
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break


class S3Store(BlobStore):
    """An S3 bucket (or any S3 API). The endpoint is `endpoint_url`, else boto3's own `AWS_ENDPOINT_URL`."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None, client=None):
        import boto3

        if not BUCKET_PATTERN.fullmatch(bucket):
            raise ValueError(f"bucket name {bucket!r} must match {BUCKET_PATTERN.pattern}")
        prefix = prefix.strip("/")
        self.bucket = bucket
        self.prefix = safe_key(prefix) if prefix else ""
        self._client = client or boto3.client("s3", endpoint_url=endpoint_url)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, key: str) -> str:
        key = safe_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, src: Path) -> None:
        self._client.upload_file(str(src), self.bucket, self._key(key))

    def get_file(self, key: str, dest: Path) -> None:
        from botocore.exceptions import ClientError

        try:
            self._client.download_file(self.bucket, self._key(key), str(dest))
        except ClientError as e:
            if _is_missing(e):
                raise BlobNotFound(key) from e
            raise

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if _is_missing(e):
                return False
            raise
        return True

    def delete_prefix(self, prefix: str) -> None:
        folder = self._key(prefix) + "/"
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=folder):
            objects = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if objects:
                # One page holds at most 1000 keys, the most one delete_objects call takes.
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})


def _is_missing(error) -> bool:
    return error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


def _open_local(uri: str) -> BlobStore:
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {uri!r} names a host; use file:///absolute/path")
        return LocalStore(Path(unquote(parts.path)))
    return LocalStore(Path(uri).expanduser())


def _open_s3(uri: str) -> BlobStore:
    parts = urlsplit(uri)
    if parts.query or parts.fragment:
        raise ValueError(f"s3 URI {uri!r} must be s3://bucket/prefix, without query or fragment")
    return S3Store(parts.netloc, parts.path)


STORE_SCHEMES: dict[str, Callable[[str], BlobStore]] = {"file": _open_local, "s3": _open_s3}


def open_store(uri: str) -> BlobStore:
    """`s3://bucket/prefix` or `file:///path`, or a plain path for a local folder."""
    if "://" not in uri:
        return _open_local(uri)
    scheme = uri.split("://", 1)[0].lower()
    opener = STORE_SCHEMES.get(scheme)
    if opener is None:
        raise ValueError(f"unknown store scheme {scheme!r} in {uri!r}; known schemes: {sorted(STORE_SCHEMES)}")
    return opener(uri)
