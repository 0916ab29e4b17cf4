"""What the registry records about one published adapter version; the identity of the whole is `content_hash`."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.identity import CONTENT_FILES, NAME_PATTERN, AdapterIdentity, content_hash
from adapters.validation import AdapterFacts

# A single path component, so a manifest cannot name a file outside its version's folder.
FILE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHA256_PATTERN = r"^[0-9a-f]{64}$"
MAX_DESCRIPTION_CHARS = 2000


class ManifestFile(BaseModel):
    """One stored file of an adapter version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(pattern=FILE_NAME_PATTERN.pattern, description="File name inside the version's folder.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="SHA-256 of the file's bytes, lowercase hex.")
    size: int = Field(ge=0, description="File size in bytes.")


class LineagePart(BaseModel):
    """One component of a published mixture."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN.pattern)
    version: int = Field(ge=1)
    content_hash: str = Field(pattern=SHA256_PATTERN)
    weight: float


class Lineage(BaseModel):
    """What a published mixture was built from, and how (adapters/compose.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["cat"] = Field(description="Rank stacking: exact, rank = the sum of the components' ranks.")
    components: tuple[LineagePart, ...] = Field(min_length=2)


class Manifest(BaseModel):
    """One immutable adapter version as published."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN.pattern, description="Adapter name.")
    version: int = Field(ge=1, description="Version number, allocated by the registry index.")
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS, description="Free text shown in listings.")
    files: tuple[ManifestFile, ...] = Field(min_length=1, description="Stored files with their hashes.")
    content_hash: str = Field(
        pattern=SHA256_PATTERN,
        description="adapters.identity.content_hash of the folder: the identity the engine keys the adapter by.",
    )
    peft_type: str = Field(description="PEFT type; always LORA.")
    rank: int = Field(ge=1, description="LoRA rank r.")
    alpha: float = Field(gt=0, description="lora_alpha.")
    target_modules: tuple[str, ...] = Field(min_length=1, description="Adapted projections, sorted.")
    base_model_id: str = Field(min_length=1, description="Id of the base model the adapter was validated against.")
    size_bytes: int = Field(ge=0, description="Total bytes of the stored files.")
    created_at: str = Field(description="When the version was published, ISO-8601 UTC (trailing Z).")
    lineage: Lineage | None = Field(default=None, description="A mixture's components; None for a pushed folder.")

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, files: tuple[ManifestFile, ...]) -> tuple[ManifestFile, ...]:
        paths = [f.path for f in files]
        if len(set(paths)) != len(paths):
            raise ValueError(f"file paths must be unique, got {paths}")
        return files

    @field_validator("created_at")
    @classmethod
    def _utc_timestamp(cls, value: str) -> str:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as e:
            raise ValueError(f"created_at must be ISO-8601, got {value!r}") from e
        if not value.endswith("Z") or parsed.utcoffset() is None:
            raise ValueError(f"created_at must be UTC with a trailing Z, got {value!r}")
        return value

    @property
    def identity(self) -> AdapterIdentity:
        return AdapterIdentity(self.name, self.version, self.content_hash)

    @property
    def label(self) -> str:
        return self.identity.label


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def file_digest(path: Path) -> ManifestFile:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return ManifestFile(path=path.name, sha256=digest.hexdigest(), size=size)


def build_manifest(name: str, version: int, description: str, folder: Path, facts: AdapterFacts,
                   base_model_id: str, lineage: Lineage | None = None) -> Manifest:
    """The manifest of a validated folder; only the files that define the adapter are recorded."""
    files = tuple(file_digest(folder / file_name) for file_name in CONTENT_FILES)
    return Manifest(
        name=name,
        version=version,
        description=description,
        files=files,
        content_hash=content_hash(folder),
        peft_type=facts.peft_type,
        rank=facts.rank,
        alpha=facts.alpha,
        target_modules=facts.target_modules,
        base_model_id=base_model_id,
        size_bytes=sum(f.size for f in files),
        created_at=utc_now(),
        lineage=lineage,
    )


def blob_key(manifest: Manifest, file: ManifestFile) -> str:
    """Where the registry stores one file of a version: `{name}/{version}/{file}`."""
    return f"{manifest.name}/{manifest.version}/{file.path}"
