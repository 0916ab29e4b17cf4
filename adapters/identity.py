"""Who an adapter is: names, references to versions, and the identity every cache keys on.

A request's `model` is parsed once into a `ModelRef`; a published version is an `AdapterIdentity` (name,
version, content hash); what the engine loads is an `AdapterIdentity` plus the folder holding its files
(`LocatedAdapter`). The content hash is part of the identity, so no cache can serve an old version under a
reused name. `version_label` is the one spelling of `name@version`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ALIAS_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
VERSION_PATTERN = re.compile(r"^[1-9][0-9]{0,8}$")
MAX_VERSION = 999_999_999  # what VERSION_PATTERN allows; SQLite integers hold it
STABLE = "stable"  # the alias a bare NAME resolves to
# Names of the mixtures built for requests (api/generation/mixtures.py); not callable by name.
MIXTURE_PREFIX = "mixture-"

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Files that define what the adapter computes; READMEs and the like don't change its identity.
CONTENT_FILES = (CONFIG_FILE, WEIGHTS_FILE)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"adapter name {name!r} must match {NAME_PATTERN.pattern}")
    return name


def check_alias(alias: str) -> str:
    if not isinstance(alias, str) or not ALIAS_PATTERN.fullmatch(alias):
        raise ValueError(f"alias {alias!r} must match {ALIAS_PATTERN.pattern}")
    return alias


def check_version(version: int) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version must be an integer in [1, {MAX_VERSION}], got {version!r}")
    return version


def version_label(name: str, version: int | str) -> str:
    """`name@version`, as responses, metrics, the ledger and the CLI show a version."""
    return f"{name}@{version}"


@dataclass(frozen=True)
class ModelRef:
    """A parsed reference: `NAME` (its `stable` alias), `NAME@VERSION` or `NAME:ALIAS`."""

    name: str
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        if self.version is not None:
            return version_label(self.name, self.version)
        return f"{self.name}:{self.alias}" if self.alias is not None else self.name


def parse_model_ref(ref: str) -> ModelRef:
    """`NAME`, `NAME@VERSION` or `NAME:ALIAS`; anything else raises ValueError."""
    if not isinstance(ref, str) or not ref:
        raise ValueError("adapter reference must be a non-empty string")
    name, at, version = ref.partition("@")
    if at:
        if not NAME_PATTERN.fullmatch(name) or not VERSION_PATTERN.fullmatch(version):
            raise ValueError(f"adapter reference {ref!r} must be NAME@VERSION with a version >= 1")
        return ModelRef(name=name, version=int(version))
    name, colon, alias = ref.partition(":")
    if colon:
        if not NAME_PATTERN.fullmatch(name) or not ALIAS_PATTERN.fullmatch(alias):
            raise ValueError(f"adapter reference {ref!r} must be NAME:ALIAS, the alias matching "
                             f"{ALIAS_PATTERN.pattern}")
        return ModelRef(name=name, alias=alias)
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"adapter name {ref!r} must match {NAME_PATTERN.pattern}")
    return ModelRef(name=name)


@dataclass(frozen=True)
class AdapterIdentity:
    """One published adapter version. Two versions with the same content still differ by version number;
    the engine keys its caches on name and content hash (`engine.adapter_ids`)."""

    name: str
    version: int
    content_hash: str  # SHA-256 hex of CONTENT_FILES, see content_hash()

    @property
    def label(self) -> str:
        return version_label(self.name, self.version)


@dataclass(frozen=True)
class LocatedAdapter:
    """An adapter version and the local folder its files are in: what the engine loads."""

    identity: AdapterIdentity
    path: Path


def content_hash(path: Path) -> str:
    """SHA-256 over the names and bytes of the files that define the adapter."""
    digest = hashlib.sha256()
    for file_name in CONTENT_FILES:
        digest.update(file_name.encode() + b"\0")
        with (path / file_name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
