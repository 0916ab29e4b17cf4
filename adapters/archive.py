"""Safe extraction of an uploaded adapter archive (tar, tar.gz or zip, detected from the bytes).

Only regular files and folders are accepted, at the archive root or inside one top-level folder. Every
member is checked before anything is written; sizes are limited by what the archive declares and again by
the bytes actually written, and a gzip stream is never inflated past the limit.
"""

from __future__ import annotations

import io
import shutil
import stat
import struct
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from adapters.identity import CONFIG_FILE
from adapters.store import KEY_PART

# Per tar member: a 512-byte header, padding to 512, and possibly a long-name or pax header in front.
TAR_OVERHEAD_PER_MEMBER = 4 * 512
TAR_TRAILER = 20 * 512
SPOOL_BYTES = 64 * 1024 * 1024
# NotImplementedError: a zip compression method Python cannot read.
CORRUPT = (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError)


class ArchiveError(ValueError):
    """Every problem found in one archive."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("archive: " + "; ".join(problems))


@dataclass(frozen=True)
class _Member:
    name: str
    parts: tuple[str, ...]
    is_dir: bool
    size: int
    open: Callable[[], IO[bytes]]


def extract_archive(data: bytes, dest: Path, max_bytes: int, max_files: int = 64) -> Path:
    """Extract into `dest` (absent or empty); returns the folder holding adapter_config.json."""
    problems: list[str] = []
    with _ArchiveReader(data, max_bytes, max_files, problems) as members:
        root = _layout_problems(members, problems)
        if problems:
            raise ArchiveError(problems)
        created = not dest.exists()
        if not created and any(dest.iterdir()):
            raise ArchiveError([f"destination {dest.name} is not empty"])
        dest.mkdir(parents=True, exist_ok=True)
        try:
            _write(members, dest, max_bytes)
        except CORRUPT as e:
            _clear(dest, remove=created)
            raise ArchiveError([f"the archive is corrupt: {e}"]) from e
        except BaseException:
            _clear(dest, remove=created)
            raise
    return dest.joinpath(*root)


class _ArchiveReader:
    """The archive's members, checked one by one as they are read; problems go to the shared list."""

    def __init__(self, data: bytes, max_bytes: int, max_files: int, problems: list[str]):
        self._data, self._max_bytes, self._max_files, self._problems = data, max_bytes, max_files, problems
        self._closers: list[Callable[[], None]] = []

    def __enter__(self) -> list[_Member]:
        try:
            if self._data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
                return self._zip_members()
            if self._data[:2] == b"\x1f\x8b":
                inflated = self._gunzip()
                return [] if inflated is None else self._tar_members(inflated)
            if self._data[257:262] == b"ustar":
                return self._tar_members(io.BytesIO(self._data))
        except CORRUPT as e:
            self._problems.append(f"the archive is corrupt: {e}")
            return []
        self._problems.append("not a tar, tar.gz or zip archive")
        return []

    def __exit__(self, *exc) -> None:
        for close in reversed(self._closers):
            close()
        self._closers.clear()

    def _gunzip(self) -> IO[bytes] | None:
        """The inflated stream; None (a problem) once it exceeds what max_bytes of files take in a tar."""
        cap = self._max_bytes + TAR_OVERHEAD_PER_MEMBER * (4 * self._max_files + 8) + TAR_TRAILER
        out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        self._closers.append(out.close)
        pending, written = self._data, 0
        while pending:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = inflater.decompress(pending, cap + 1 - written)
            while chunk:
                written += len(chunk)
                if written > cap:
                    self._problems.append(f"the archive inflates beyond {cap} bytes")
                    return None
                out.write(chunk)
                chunk = inflater.decompress(inflater.unconsumed_tail, cap + 1 - written)
            if not inflater.eof:
                raise EOFError("gzip stream ends early")
            pending = inflater.unused_data
        out.seek(0)
        return out

    def _tar_members(self, stream: IO[bytes]) -> list[_Member]:
        tar = tarfile.open(fileobj=stream, mode="r:")
        self._closers.append(tar.close)
        members, declared, entries = [], 0, 0
        # Read header by header so that a huge archive is refused without walking all of it.
        while (info := tar.next()) is not None:
            entries += 1
            kind = None if info.isfile() or info.isdir() else _tar_kind(info)
            member = self._check(info.name, info.isdir(), info.size, kind, lambda info=info: tar.extractfile(info))
            if member is not None:
                members.append(member)
            declared += info.size if info.isfile() else 0
            if entries > 4 * self._max_files:
                self._problems.append(f"the archive holds more than {4 * self._max_files} entries")
                break
            if declared > self._max_bytes:
                break
        self._count_problems(members, declared)
        return members

    def _zip_members(self) -> list[_Member]:
        entries = zip_entry_count(self._data)
        if entries is None or entries > 4 * self._max_files:
            # Refused from the end record, before zipfile reads (and holds) the whole central directory.
            self._problems.append(f"the archive holds more than {4 * self._max_files} entries")
            return []
        archive = zipfile.ZipFile(io.BytesIO(self._data))
        self._closers.append(archive.close)
        members, declared = [], 0
        for info in archive.infolist():
            mode = info.external_attr >> 16
            kind = None
            if stat.S_ISLNK(mode):
                kind = "a symlink"
            elif stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                kind = "a special file"
            elif info.flag_bits & 0x1:
                kind = "encrypted"
            member = self._check(info.filename, info.is_dir(), info.file_size, kind,
                                 lambda info=info: archive.open(info))
            if member is not None:
                members.append(member)
            declared += 0 if info.is_dir() else info.file_size
        self._count_problems(members, declared)
        return members

    def _check(self, name: str, is_dir: bool, size: int, kind: str | None,
               opener: Callable[[], IO[bytes]]) -> _Member | None:
        """A member whose name and type are acceptable, else None with the problem recorded."""
        if kind is not None:
            self._problems.append(f"{name!r} is {kind}; only regular files and folders are accepted")
            return None
        if name.startswith("/") or "\\" in name or "\0" in name or (len(name) > 1 and name[1] == ":"):
            self._problems.append(f"{name!r} is an absolute or non-POSIX path")
            return None
        parts = tuple(p for p in name.split("/") if p not in ("", "."))
        if ".." in parts:
            self._problems.append(f"{name!r} climbs out with '..'")
            return None
        bad = [p for p in parts if not KEY_PART.fullmatch(p)]
        if bad:
            self._problems.append(f"{name!r} has a name outside {KEY_PART.pattern}")
            return None
        if len(parts) > (1 if is_dir else 2):
            self._problems.append(f"{name!r} is nested more than one folder deep")
            return None
        if not parts:
            return None  # the archive root itself, "./"
        return _Member(name=name, parts=parts, is_dir=is_dir, size=size, open=opener)

    def _count_problems(self, members: list[_Member], declared: int) -> None:
        files = [m for m in members if not m.is_dir]
        if len(files) > self._max_files:
            self._problems.append(f"the archive holds more than {self._max_files} files")
        if declared > self._max_bytes:
            self._problems.append(f"the archive's files declare more than {self._max_bytes} bytes")
        seen: set[tuple[str, ...]] = set()
        for member in files:
            if member.parts in seen:
                self._problems.append(f"{member.name!r} appears twice")
            seen.add(member.parts)


def zip_entry_count(data: bytes) -> int | None:
    """Entries a zip's end-of-central-directory record declares; None when it is missing or says ZIP64 (0xFFFF:
    the real count is elsewhere, and no adapter needs that many files)."""
    # The record is 22 bytes plus a comment of at most 65,535, at the very end.
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - 22 - 65535))
    if at < 0 or at + 22 > len(data):
        return None
    (count,) = struct.unpack_from("<H", data, at + 10)
    return None if count == 0xFFFF else count


def _tar_kind(info: tarfile.TarInfo) -> str:
    if info.issym():
        return "a symlink"
    if info.islnk():
        return "a hard link"
    if info.isdev():
        return "a device or fifo"
    return "not a regular file"


def _layout_problems(members: list[_Member], problems: list[str]) -> tuple[str, ...]:
    """The folder (relative parts) that holds the adapter: the root or the single top-level folder."""
    files = [m for m in members if not m.is_dir]
    at_root = [m for m in files if len(m.parts) == 1]
    folders = sorted({m.parts[0] for m in members if len(m.parts) == 2 or m.is_dir})
    if at_root and folders:
        problems.append("files must be either at the archive root or inside one top-level folder, not both")
        return ()
    if len(folders) > 1:
        problems.append(f"the archive has more than one top-level folder: {folders}")
        return ()
    root = tuple(folders)
    if members and not any(m.parts == (*root, CONFIG_FILE) for m in files):
        problems.append(f"no {CONFIG_FILE} at the archive root or in its top-level folder")
    elif not files and not problems:
        problems.append("the archive holds no files")
    return root


def _write(members: list[_Member], dest: Path, max_bytes: int) -> None:
    written = 0
    for member in members:
        target = dest.joinpath(*member.parts)
        if member.is_dir:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with member.open() as source, target.open("xb") as out:
            while block := source.read(1 << 20):
                written += len(block)
                if written > max_bytes:
                    raise ArchiveError([f"the archive's files hold more than {max_bytes} bytes"])
                out.write(block)


def _clear(dest: Path, remove: bool) -> None:
    if remove:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
