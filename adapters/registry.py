"""The adapter registry: validated, versioned, content-addressed adapters in a blob store plus an index.

A push validates the folder against the base model (every problem at once), reserves the next version,
uploads the files under `{name}/{version}/{file}` and only then records the version, so a reader never sees
a version whose files are missing. Pushing content identical to the newest version of a name returns that
version instead of creating a duplicate (a description given with it still updates the name's description);
two identical pushes racing each other may both create versions.

References are `NAME` (the `stable` alias), `NAME@V` (a pinned version) and `NAME:ALIAS`; see
adapters/index.py for how `stable` moves.

Errors: AdapterValidationError (push; every problem), ValueError (malformed name, alias, version or
reference), AdapterNotFound (LookupError; names the reference, never a path), adapters.index.RegistryError
(a ValueError: AliasInUse on delete, NothingToRollBack on rollback).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from adapters.base_model import BaseModelSpec
from adapters.home import data_home
from adapters.identity import STABLE, ModelRef, check_alias, check_name, check_version, content_hash, version_label
from adapters.index import RegistryIndex, VersionNotFound
from adapters.compose import METHOD, Component, compose
from adapters.manifest import MAX_DESCRIPTION_CHARS, Lineage, LineagePart, Manifest, blob_key, build_manifest
from adapters.store import BlobStore, open_store
from adapters.validation import AdapterFacts, ValidationLimits, validate_adapter_dir

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


class RegistryConfig(BaseModel):
    """Where the registry keeps adapters and how much the local cache may hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store_uri: str | None = Field(
        default=None,
        description="Adapter file store: s3://bucket/prefix, file:///path or a folder "
        "(default: <data home>/registry/blobs).",
    )
    index_url: str | None = Field(
        default=None,
        description="Index of versions and aliases: a SQLite file (a path or sqlite:///path), or "
        "postgresql://user@host/db for an index shared by replicas (default: <data home>/registry/index.sqlite).",
    )
    max_adapter_bytes: int = Field(
        default=512 * MIB, ge=1, description="Largest adapter folder a push accepts, in bytes."
    )
    disk_cache_dir: str | None = Field(
        default=None,
        description="Local folder of adapters fetched from the store (default: <data home>/cache/adapters).",
    )
    disk_cache_bytes: int = Field(
        default=2048 * MIB, ge=0,
        description="Bytes the local adapter cache may hold before evicting the least recently used.",
    )

    def resolved_store_uri(self) -> str:
        return self.store_uri or str(data_home() / "registry" / "blobs")

    def resolved_index_url(self) -> str:
        return self.index_url or str(data_home() / "registry" / "index.sqlite")

    def resolved_disk_cache_dir(self) -> Path:
        return Path(self.disk_cache_dir).expanduser() if self.disk_cache_dir else data_home() / "cache" / "adapters"


class AdapterNotFound(LookupError):
    """No adapter version answers to the reference; the message names the reference, never a path."""

    def __init__(self, ref: str, reason: str = ""):
        self.ref = ref
        super().__init__(reason or f"adapter {ref!r} not found")


class AdapterIncompatible(AdapterNotFound):
    """The version exists but was published for another base model; for this server it does not exist."""


class AdapterSummary(BaseModel):
    """One adapter name with all its versions and aliases."""

    name: str = Field(description="Adapter name.")
    description: str = Field(description="Description given at push.")
    versions: list[Manifest] = Field(description="Published versions, oldest first.")
    aliases: dict[str, int] = Field(description="Alias -> version.")


class AdapterDetail(BaseModel):
    """What a reference resolves to, with the context of its name."""

    ref: str = Field(description="The reference as given.")
    manifest: Manifest = Field(description="The version the reference resolves to.")
    description: str = Field(description="Description of the adapter name.")
    versions: list[int] = Field(description="All published versions of the name.")
    aliases: dict[str, int] = Field(description="Alias -> version for the name.")


class Registry:
    """The facade over index and store. `base` may be None for tools that neither push nor resolve."""

    def __init__(self, index: RegistryIndex, store: BlobStore, base: BaseModelSpec | None, limits: ValidationLimits):
        self.index = index
        self.store = store
        self._base = base
        self.limits = limits

    @property
    def base(self) -> BaseModelSpec:
        if self._base is None:
            raise RuntimeError("this registry was opened without a base model; push and resolve need one")
        return self._base

    @classmethod
    def from_config(cls, config: RegistryConfig, base: BaseModelSpec | None, max_lora_rank: int) -> Registry:
        return cls(
            index=RegistryIndex(config.resolved_index_url()),
            store=open_store(config.resolved_store_uri()),
            base=base,
            limits=ValidationLimits(max_lora_rank=max_lora_rank, max_bytes=config.max_adapter_bytes),
        )

    def close(self) -> None:
        self.index.close()

    def push(self, path: Path, name: str, description: str = "") -> Manifest:
        """Publish the adapter folder at `path` as the next version of `name` (see the module docstring)."""
        return self.push_with_status(path, name, description)[0]

    def push_with_status(self, path: Path, name: str, description: str = "",
                         lineage: Lineage | None = None) -> tuple[Manifest, bool]:
        """Like push; the flag is False when the newest version already had this content."""
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise ValueError(f"description is {len(description)} characters, more than {MAX_DESCRIPTION_CHARS}")
        facts = validate_adapter_dir(name, path, self.base, self.limits)
        reservation = self.index.reserve_version(name, content_hash(path), description)
        if reservation.existing is not None:
            return reservation.existing, False
        version = reservation.version
        try:
            manifest = build_manifest(name, version, description, path, facts, self.base.model_id, lineage)
            for file in manifest.files:
                self.store.put_file(blob_key(manifest, file), path / file.path)
            self.index.commit_version(manifest)
        except BaseException:
            self._abandon(name, version)
            raise
        return manifest, True

    def compose(self, name: str, parts: list[tuple[ModelRef, float]], description: str = "") -> tuple[Manifest, bool]:
        """Publishes the weighted mixture of `parts` (each a published version and its weight) as the next version
        of `name`, built exactly (adapters/compose.py), validated like any push, its lineage in the manifest.
        Raises AdapterNotFound for a part that names nothing, CompositionError when they cannot be mixed."""
        manifests = [self.resolve(ref) for ref, _ in parts]
        with tempfile.TemporaryDirectory(prefix="loraplex-compose-") as tmp:
            components = []
            for i, (manifest, (_, weight)) in enumerate(zip(manifests, parts)):
                folder = Path(tmp) / f"part-{i}"
                folder.mkdir()
                for file in manifest.files:
                    self.store.get_file(blob_key(manifest, file), folder / file.path)
                components.append(Component(manifest.label, manifest.content_hash, weight, folder))
            mixture = compose(components, Path(tmp) / "mixture")
            lineage = Lineage(method=METHOD, components=tuple(
                LineagePart(name=m.name, version=m.version, content_hash=m.content_hash, weight=weight)
                for m, (_, weight) in zip(manifests, parts)))
            return self.push_with_status(mixture, name, description, lineage)

    def _abandon(self, name: str, version: int) -> None:
        try:
            self.store.delete_prefix(f"{name}/{version}")
        except Exception:
            logger.warning("could not remove the partial upload of %s@%d", name, version, exc_info=True)
        self.index.release_version(name, version)

    def resolve(self, ref: ModelRef) -> Manifest:
        """The version `ref` names, for serving on this registry's base model.

        Raises AdapterNotFound (AdapterIncompatible for another base model) for one that names nothing servable.
        """
        manifest = self._lookup(ref)
        if manifest.base_model_id != self.base.model_id:
            raise AdapterIncompatible(str(ref), f"adapter {str(ref)!r} was published for base model "
                                                f"{manifest.base_model_id!r}, not {self.base.model_id!r}")
        return manifest

    def check_folder(self, manifest: Manifest, path: Path) -> AdapterFacts:
        """Validates a fetched copy of a version as a push does (same base model and limits)."""
        return validate_adapter_dir(manifest.name, path, self.base, self.limits)

    def show(self, ref: ModelRef) -> AdapterDetail:
        manifest = self._lookup(ref)
        return AdapterDetail(
            ref=str(ref),
            manifest=manifest,
            description=self.index.description(manifest.name),
            versions=[m.version for m in self.index.versions(manifest.name)],
            aliases=self.index.aliases(manifest.name),
        )

    def _lookup(self, ref: ModelRef) -> Manifest:
        version = ref.version
        if version is None:
            alias = ref.alias or STABLE
            version = self.index.alias_target(ref.name, alias)
            if version is None:
                reason = (f"adapter {str(ref)!r} not found" if ref.alias is None
                          else f"adapter {ref.name!r} has no alias {alias!r}")
                raise AdapterNotFound(str(ref), reason)
        try:
            return self.index.get(ref.name, version)
        except VersionNotFound as e:
            raise AdapterNotFound(str(ref)) from e

    def promote(self, name: str, version: int, alias: str = STABLE) -> Manifest:
        """Point `alias` at `name@version`; for `stable` this stops it following new pushes."""
        check_name(name)
        check_version(version)
        check_alias(alias)
        try:
            self.index.set_alias(name, alias, version)
            return self.index.get(name, version)
        except VersionNotFound as e:
            raise AdapterNotFound(version_label(name, version)) from e

    def rollback(self, name: str, alias: str = STABLE) -> Manifest:
        """Move `alias` back to its previous target; raises NothingToRollBack when there is none."""
        check_name(name)
        check_alias(alias)
        try:
            return self.index.get(name, self.index.rollback(name, alias))
        except VersionNotFound as e:
            raise AdapterNotFound(f"{name}:{alias}", f"adapter {name!r} has no alias {alias!r}") from e

    def delete(self, name: str, version: int) -> None:
        """Remove a version and its files; refused (AliasInUse) while an alias points at it."""
        check_name(name)
        check_version(version)
        try:
            self.index.delete_version(name, version)
        except VersionNotFound as e:
            raise AdapterNotFound(version_label(name, version)) from e
        self.store.delete_prefix(f"{name}/{version}")

    def list(self) -> list[AdapterSummary]:
        return [
            AdapterSummary(name=name, description=self.index.description(name), versions=self.index.versions(name),
                           aliases=self.index.aliases(name))
            for name in self.index.names()
        ]
