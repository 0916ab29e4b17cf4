from __future__ import annotations

import gzip
import io
import tarfile
import zipfile

import pytest

from adapters.archive import ArchiveError, extract_archive, zip_entry_count
from adapters.identity import content_hash

MIB = 1024 * 1024
FILES = ("adapter_config.json", "adapter_model.safetensors")


def tar_bytes(entries: list[tuple[str, bytes | str | None, bytes]], mode: str = "w:gz") -> bytes:
    """entries: (name, kind, data) with kind one of file, dir, sym, lnk, fifo."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as tar:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = data.decode() if kind in ("sym", "lnk") else ""
            tar.addfile(info)
    return out.getvalue()


def zip_bytes(entries: list[tuple[str, bytes]], symlinks: tuple[str, ...] = ()) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
        for name in symlinks:
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            archive.writestr(info, "/etc/passwd")
    return out.getvalue()


@pytest.fixture(scope="module")
def adapter_files(demo_assets) -> dict[str, bytes]:
    folder = demo_assets.adapter_dirs["sql-helper"]
    return {name: (folder / name).read_bytes() for name in FILES}


def _ok(adapter_files, prefix=""):
    return [(prefix + name, "file", data) for name, data in adapter_files.items()]


@pytest.mark.parametrize("make,inner", [
    (lambda f: tar_bytes([("sql-helper", "dir", b"")] + _ok(f, "sql-helper/")), "sql-helper"),
    (lambda f: tar_bytes(_ok(f, "./"), mode="w"), ""),
    (lambda f: tar_bytes(_ok(f), mode="w:gz"), ""),
    (lambda f: zip_bytes([(n, d) for n, d in f.items()]), ""),
    (lambda f: zip_bytes([("adapter/", b"")] + [(f"adapter/{n}", d) for n, d in f.items()]), "adapter"),
])
def test_extracts(tmp_path, demo_assets, adapter_files, make, inner):
    dest = tmp_path / "out"
    folder = extract_archive(make(adapter_files), dest, max_bytes=MIB)
    assert folder == dest / inner if inner else folder == dest
    assert content_hash(folder) == content_hash(demo_assets.adapter_dirs["sql-helper"])


CONFIG = ("adapter_config.json", "file", b"{}")


@pytest.mark.parametrize("data,max_bytes,fragment", [
    (tar_bytes([CONFIG, ("../x", "file", b"x")]), MIB, "'../x' climbs out with '..'"),
    (tar_bytes([CONFIG, ("a/../../x", "file", b"x")]), MIB, "climbs out"),
    (tar_bytes([CONFIG, ("/abs", "file", b"x")]), MIB, "'/abs' is an absolute"),
    (tar_bytes([CONFIG, ("link", "sym", b"/etc/passwd")]), MIB, "'link' is a symlink"),
    (tar_bytes([CONFIG, ("hard", "lnk", b"adapter_config.json")]), MIB, "'hard' is a hard link"),
    (tar_bytes([CONFIG, ("pipe", "fifo", b"")]), MIB, "'pipe' is a device or fifo"),
    (tar_bytes([CONFIG, ("big", "file", b"x" * 5000)]), 4096, "declare more than 4096 bytes"),
    (tar_bytes([CONFIG] + [(f"f{i}", "file", b"") for i in range(5)]), MIB, "more than 4 files"),
    (tar_bytes([CONFIG] + [(f"d{i}", "dir", b"") for i in range(20)]), MIB, "more than 16 entries"),
    (tar_bytes([("a/b/adapter_config.json", "file", b"{}")]), MIB, "nested more than one folder deep"),
    (tar_bytes([("a/adapter_config.json", "file", b"{}"), ("b/x", "file", b"")]), MIB,
     "more than one top-level folder: ['a', 'b']"),
    (tar_bytes([CONFIG, ("a/x", "file", b"")]), MIB, "not both"),
    (tar_bytes([("x", "file", b"")]), MIB, "no adapter_config.json"),
    (tar_bytes([CONFIG, ("bad name", "file", b"")]), MIB, "'bad name' has a name outside"),
    (tar_bytes([CONFIG, ("adapter_config.json", "file", b"{}")]), MIB, "appears twice"),
    (tar_bytes([]), MIB, "holds no files"),
    (zip_bytes([("adapter_config.json", b"{}")], symlinks=("link",)), MIB, "'link' is a symlink"),
    (zip_bytes([("adapter_config.json", b"{}"), ("..\\x", b"")]), MIB, "absolute or non-POSIX"),
    (zip_bytes([("adapter_config.json", b"{}"), ("/abs", b"")]), MIB, "'/abs' is an absolute"),
    (zip_bytes([("adapter_config.json", b"{}"), ("big", b"\0" * 8192)]), 4096, "declare more than 4096"),
    (b"plain text, not an archive" * 20, MIB, "not a tar, tar.gz or zip archive"),
    (gzip.compress(b"\0" * (8 * MIB)), MIB, "inflates beyond"),
    (tar_bytes([CONFIG])[:40], MIB, "corrupt"),
])
def test_rejects(tmp_path, data, max_bytes, fragment):
    dest = tmp_path / "out"
    with pytest.raises(ArchiveError) as info:
        extract_archive(data, dest, max_bytes=max_bytes, max_files=4)
    assert any(fragment in p for p in info.value.problems), info.value.problems
    assert not dest.exists()


def test_every_problem_listed(tmp_path):
    data = tar_bytes([CONFIG, ("../x", "file", b""), ("link", "sym", b"/etc"), ("/abs", "file", b"")])
    with pytest.raises(ArchiveError) as info:
        extract_archive(data, tmp_path / "out", max_bytes=MIB)
    assert len(info.value.problems) == 3


def test_destination_must_be_empty(tmp_path, adapter_files):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep").write_text("x")
    with pytest.raises(ArchiveError, match="not empty"):
        extract_archive(tar_bytes(_ok(adapter_files)), dest, max_bytes=MIB)
    assert [p.name for p in dest.iterdir()] == ["keep"]


def test_a_zip_declaring_too_many_entries_is_refused_before_its_directory_is_read(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(300):
            archive.writestr(f"f{i}.txt", b"")
    with pytest.raises(ArchiveError, match="more than 256 entries"):
        extract_archive(buffer.getvalue(), tmp_path / "out", max_bytes=10**6)


@pytest.mark.parametrize(("data", "count"), [
    (b"", None),
    (b"not a zip", None),
    (b"PK\x05\x06" + b"\0" * 6 + b"\x03\x00" + b"\0" * 10, 3),
    (b"PK\x05\x06" + b"\0" * 6 + b"\xff\xff" + b"\0" * 10, None),  # ZIP64: the count is elsewhere
])
def test_zip_entry_count(data, count):
    assert zip_entry_count(data) == count
