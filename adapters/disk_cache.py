"""The local-disk tier: adapter versions fetched from the blob store, verified, kept under a byte budget (LRU).

Layout: `root/{name}/{version}-{content_hash[:16]}/{files}`. A download goes to `root/.tmp/`, every file is
checked against the manifest (size and SHA-256, then the content hash the engine keys by), and only then is
the folder renamed into place, so a folder under its final name is always complete. Least recently used
order survives restarts through folder mtimes, which each hit refreshes.

Eviction deletes folders: hold a pin on the name while something reads the files (the engine loading them).
One fetched adapter larger than the whole budget is kept; the budget is then exceeded until the next fetch.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from adapters.identity import CONTENT_FILES, NAME_PATTERN, content_hash, version_label
from adapters.manifest import Manifest, blob_key, file_digest
from adapters.store import BlobNotFound, BlobStore

logger = logging.getLogger(__name__)

ENTRY_DIR = re.compile(r"^(?P<version>[1-9][0-9]*)-(?P<hash>[0-9a-f]{16})$")
TEMP_DIR = ".tmp"


class CacheIntegrityError(ValueError):
    """A fetched file does not match its manifest; nothing of the download is kept."""


@dataclass(frozen=True)
class CacheEntry:
    name: str
    version: int
    hash_prefix: str  # content_hash[:16]
    path: Path
    size_bytes: int

    @property
    def label(self) -> str:
        return version_label(self.name, self.version)


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    total_bytes: int
    budget_bytes: int
    num_entries: int


class CacheFetch(NamedTuple):
    path: Path
    hit: bool
    evicted: tuple[CacheEntry, ...]


def _entry_key(name: str, version: int, hash_prefix: str) -> str:
    return f"{name}/{version}-{hash_prefix}"


def _folder_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.iterdir() if p.is_file() and not p.is_symlink())


class AdapterDiskCache:
    """Thread-safe; concurrent fetches of one version download it once."""

    def __init__(self, root: Path, budget_bytes: int, store: BlobStore,
                 on_evict: Callable[[CacheEntry], None] | None = None):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.budget_bytes = budget_bytes
        self.store = store
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()  # least recently used first
        self._pins: Counter[str] = Counter()
        self._inflight: dict[str, threading.Lock] = {}
        self._hits = self._misses = self._evictions = 0
        shutil.rmtree(self.root / TEMP_DIR, ignore_errors=True)
        self._scan()

    def _scan(self) -> None:
        found = []
        for name_dir in self.root.iterdir():
            if name_dir.is_symlink() or not name_dir.is_dir() or not NAME_PATTERN.fullmatch(name_dir.name):
                continue
            for entry_dir in name_dir.iterdir():
                match = ENTRY_DIR.fullmatch(entry_dir.name)
                if match is None or entry_dir.is_symlink() or not entry_dir.is_dir():
                    continue
                entry = CacheEntry(name=name_dir.name, version=int(match["version"]), hash_prefix=match["hash"],
                                   path=entry_dir, size_bytes=_folder_bytes(entry_dir))
                found.append((entry_dir.stat().st_mtime, entry))
        for _, entry in sorted(found, key=lambda item: item[0]):
            self._entries[_entry_key(entry.name, entry.version, entry.hash_prefix)] = entry

    @staticmethod
    def _key(manifest: Manifest) -> str:
        return _entry_key(manifest.name, manifest.version, manifest.content_hash[:16])

    def fetch(self, manifest: Manifest) -> tuple[Path, bool]:
        """The local folder of the version and whether it was already here; evictions go to `on_evict`."""
        result = self.fetch_detailed(manifest)
        return result.path, result.hit

    def fetch_detailed(self, manifest: Manifest) -> CacheFetch:
        key = self._key(manifest)
        with self._lock:
            if key in self._entries:
                return self._hit(key)
            gate = self._inflight.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._entries:
                    return self._hit(key)
            try:
                path = self._download(manifest)
                with self._lock:
                    self._entries[key] = CacheEntry(name=manifest.name, version=manifest.version,
                                                    hash_prefix=manifest.content_hash[:16], path=path,
                                                    size_bytes=_folder_bytes(path))
                    self._misses += 1
                    evicted = self._evict_over_budget(keep=key)
            finally:
                with self._lock:
                    self._inflight.pop(key, None)
        self._report(evicted)
        return CacheFetch(path=path, hit=False, evicted=tuple(evicted))

    def _hit(self, key: str) -> CacheFetch:
        entry = self._entries[key]
        self._entries.move_to_end(key)
        self._hits += 1
        try:
            os.utime(entry.path)
        except OSError:
            logger.warning("could not refresh the mtime of %s", entry.path)
        return CacheFetch(path=entry.path, hit=True, evicted=())

    def _download(self, manifest: Manifest) -> Path:
        temp = self.root / TEMP_DIR / uuid.uuid4().hex
        temp.mkdir(parents=True)
        try:
            problems = []
            for file in manifest.files:
                dest = temp / file.path  # a single path component: the Manifest model guarantees it
                try:
                    self.store.get_file(blob_key(manifest, file), dest)
                except BlobNotFound as e:
                    raise CacheIntegrityError(f"{manifest.label}: file {file.path} is missing from the store") from e
                got = file_digest(dest)
                if got.size != file.size:
                    problems.append(f"file {file.path} has {got.size} bytes, the manifest says {file.size}")
                elif got.sha256 != file.sha256:
                    problems.append(f"file {file.path} has sha256 {got.sha256}, the manifest says {file.sha256}")
            missing = sorted(set(CONTENT_FILES) - {file.path for file in manifest.files})
            if missing:
                problems.append(f"the manifest lists no {', '.join(missing)}")
            elif not problems and content_hash(temp) != manifest.content_hash:
                problems.append("the files' content hash differs from the manifest's content_hash")
            if problems:
                raise CacheIntegrityError(f"{manifest.label} from the store: " + "; ".join(problems))
            final = self.root / manifest.name / f"{manifest.version}-{manifest.content_hash[:16]}"
            final.parent.mkdir(exist_ok=True)
            try:
                os.rename(temp, final)
            except OSError:
                if not final.is_dir():
                    raise
                # Already placed (another process sharing the folder); its content passed the same checks.
                shutil.rmtree(temp)
            return final
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise

    def _evict_over_budget(self, keep: str) -> list[CacheEntry]:
        evicted = []
        total = sum(entry.size_bytes for entry in self._entries.values())
        for key in list(self._entries):
            if total <= self.budget_bytes:
                break
            entry = self._entries[key]
            if key == keep or self._pins[entry.name] > 0:
                continue
            self._remove(key)
            total -= entry.size_bytes
            evicted.append(entry)
        return evicted

    def _remove(self, key: str) -> CacheEntry:
        entry = self._entries.pop(key)
        shutil.rmtree(entry.path, ignore_errors=True)
        try:
            entry.path.parent.rmdir()
        except OSError:
            pass  # other versions of the name remain
        self._evictions += 1
        return entry

    def _report(self, evicted: list[CacheEntry]) -> None:
        if self._on_evict is None:
            return
        for entry in evicted:
            self._on_evict(entry)

    def evict(self, manifest: Manifest) -> bool:
        """Remove the version now, pinned or not; False if it was not cached."""
        key = self._key(manifest)
        with self._lock:
            if key not in self._entries:
                return False
            entry = self._remove(key)
        self._report([entry])
        return True

    def pin(self, name: str) -> None:
        """Keep every version of `name` from eviction until a matching `unpin` (pins nest)."""
        with self._lock:
            self._pins[name] += 1

    def unpin(self, name: str) -> None:
        with self._lock:
            if self._pins[name] <= 1:
                self._pins.pop(name, None)
            else:
                self._pins[name] -= 1

    def is_pinned(self, name: str) -> bool:
        with self._lock:
            return self._pins[name] > 0

    def contains(self, manifest: Manifest) -> bool:
        with self._lock:
            return self._key(manifest) in self._entries

    def entries(self) -> list[CacheEntry]:
        """Cached versions, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self._hits, misses=self._misses, evictions=self._evictions,
                              total_bytes=sum(e.size_bytes for e in self._entries.values()),
                              budget_bytes=self.budget_bytes, num_entries=len(self._entries))

