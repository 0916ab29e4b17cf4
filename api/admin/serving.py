"""The admin API's logic: publish, inspect, promote, roll back, delete, load and evict adapters."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from adapters.archive import extract_archive
from adapters.identity import CONTENT_FILES, ModelRef, check_name, parse_model_ref
from adapters.index import RegistryError
from adapters.manifest import Manifest
from adapters.registry import AdapterNotFound, AdapterSummary, Registry
from adapters.store import open_store
from adapters.tiers import EngineTiers
from adapters.validation import AdapterValidationError
from api.admin.protocol import (
    AdapterList,
    AdapterView,
    AliasView,
    DeletedVersion,
    EvictResult,
    LoadResult,
    VersionView,
)
from api.errors import OpenAIError, bad_request

REMOTE_SCHEMES = ("s3://",)


def _not_found(e: Exception) -> OpenAIError:
    return OpenAIError(404, str(e), param="name", code="adapter_not_found")


def _invalid(e: AdapterValidationError) -> OpenAIError:
    return bad_request(f"Adapter {e.name!r} is invalid: " + "; ".join(e.problems), code="invalid_adapter")


class AdminService:
    def __init__(self, registry: Registry, tiers: EngineTiers | None, max_upload_bytes: int,
                 prewarm_on_promote: bool):
        self.registry = registry
        self.tiers = tiers
        self.max_upload_bytes = max_upload_bytes
        self.prewarm_on_promote = prewarm_on_promote

    def describe(self, manifest: Manifest) -> VersionView:
        residency = self.tiers.residency() if self.tiers is not None else {}
        resident = sorted(tier for tier, labels in residency.items() if manifest.label in labels)
        return VersionView(**manifest.model_dump(), resident=resident)

    def list(self) -> AdapterList:
        return AdapterList(data=[self._summary(s) for s in self.registry.list()])

    def _summary(self, summary: AdapterSummary) -> AdapterView:
        return AdapterView(name=summary.name, description=summary.description, aliases=dict(summary.aliases),
                           versions=[self.describe(m) for m in summary.versions])

    def get(self, name: str) -> AdapterView:
        for summary in self.registry.list():
            if summary.name == name:
                return self._summary(summary)
        raise _not_found(AdapterNotFound(name))

    async def upload(self, data: bytes, name: str, description: str) -> VersionView:
        if len(data) > self.max_upload_bytes:
            raise OpenAIError(413, f"The upload is over {self.max_upload_bytes} bytes.", code="too_large")
        with tempfile.TemporaryDirectory(prefix="loraplex-upload-") as tmp:
            try:
                folder = await asyncio.to_thread(extract_archive, data, Path(tmp), self.max_upload_bytes)
            except ValueError as e:
                raise bad_request(f"The uploaded archive was refused: {e}", code="invalid_archive") from e
            return await self._push(folder, name, description)

    async def register(self, source: str, name: str, description: str) -> VersionView:
        """Copies an adapter folder from an object store URI (s3://bucket/prefix) and publishes it.

        Local paths are refused: a request must not make the server read its own files; upload an archive.
        """
        if not source.startswith(REMOTE_SCHEMES):
            raise bad_request(f"source must start with one of {REMOTE_SCHEMES}; upload local adapters as an "
                              "archive", param="source")
        try:
            store = open_store(source)
        except ValueError as e:
            raise bad_request(str(e), param="source") from e
        with tempfile.TemporaryDirectory(prefix="loraplex-register-") as tmp:
            folder = Path(tmp) / "adapter"
            folder.mkdir()
            try:
                for file_name in CONTENT_FILES:
                    await asyncio.to_thread(store.get_file, file_name, folder / file_name)
            except (OSError, LookupError, ValueError) as e:
                raise bad_request(f"Could not read the adapter at {source}: {e}", param="source") from e
            return await self._push(folder, name, description)

    async def _push(self, folder: Path, name: str, description: str) -> VersionView:
        try:
            manifest = await asyncio.to_thread(self.registry.push, folder, name, description)
        except AdapterValidationError as e:
            raise _invalid(e) from e
        except ValueError as e:  # a description or name the registry refuses
            raise bad_request(str(e), code="invalid_adapter") from e
        return self.describe(manifest)

    async def compose(self, name: str, parts: list[tuple[str, float]], description: str) -> VersionView:
        """Publishes the weighted mixture of published versions (adapters/compose.py) as the next version of `name`."""
        try:
            refs = [(parse_model_ref(model), weight) for model, weight in parts]
            manifest, _ = await asyncio.to_thread(self.registry.compose, name, refs, description)
        except AdapterNotFound as e:
            raise OpenAIError(404, str(e), param="components", code="adapter_not_found") from e
        except AdapterValidationError as e:
            raise _invalid(e) from e
        except ValueError as e:  # a malformed reference, components that cannot be mixed, a refused name
            raise bad_request(str(e), param="components", code="invalid_adapter") from e
        return self.describe(manifest)

    async def promote(self, name: str, version: int, alias: str) -> AliasView:
        try:
            manifest = self.registry.resolve(ModelRef(check_name(name), version))
            self.registry.promote(name, version, alias)
        except AdapterNotFound as e:
            raise _not_found(e) from e
        except (RegistryError, ValueError) as e:
            raise bad_request(str(e), param="alias") from e
        if self.prewarm_on_promote:
            await self.load(manifest)
        return AliasView(name=name, alias=alias, version=version)

    def rollback(self, name: str, alias: str) -> AliasView:
        try:
            manifest = self.registry.rollback(name, alias)
        except AdapterNotFound as e:
            raise _not_found(e) from e
        except (RegistryError, ValueError) as e:
            raise OpenAIError(409, str(e), param="alias", code="no_previous_version") from e
        return AliasView(name=name, alias=alias, version=manifest.version)

    def delete(self, name: str, version: int) -> DeletedVersion:
        try:
            self.registry.delete(name, version)
        except AdapterNotFound as e:
            raise _not_found(e) from e
        except (RegistryError, ValueError) as e:
            raise OpenAIError(409, str(e), code="version_in_use") from e
        return DeletedVersion(name=name, version=version)

    def resolve(self, ref: str) -> Manifest:
        try:
            return self.registry.resolve(parse_model_ref(ref))
        except (AdapterNotFound, ValueError) as e:
            raise _not_found(e) from e

    async def load(self, manifest: Manifest) -> LoadResult:
        if self.tiers is None:
            raise OpenAIError(503, "No engine tiers on this server.", code="no_engine")
        acquired = await self.tiers.acquire(manifest)
        self.tiers.release(acquired)
        return LoadResult(model=manifest.label, found_in=acquired.found_in, load_seconds=acquired.load_seconds)

    async def evict(self, manifest: Manifest) -> EvictResult:
        if self.tiers is None:
            raise OpenAIError(503, "No engine tiers on this server.", code="no_engine")
        return EvictResult(model=manifest.label, evicted=await self.tiers.evict(manifest))
