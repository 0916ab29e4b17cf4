"""Admin API wire format: request bodies and responses of the registry's admin endpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.identity import MAX_VERSION, STABLE
from adapters.manifest import Manifest


# A mixture's rank is the sum of its components': a handful already reaches --max-lora-rank.
MAX_COMPONENTS = 16


class PromoteRequest(BaseModel):
    version: int = Field(ge=1, le=MAX_VERSION, description="Version to point the alias at.")
    alias: str = Field(default=STABLE, description="Alias to move.")


class ComposePart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="A published version: NAME@V, NAME:ALIAS or NAME (its stable version).")
    weight: float = Field(allow_inf_nan=False, description="Its weight in the mixture (may be negative).")


class ComposeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    components: list[ComposePart] = Field(min_length=2, max_length=MAX_COMPONENTS,
                                          description="The adapters to mix and their weights.")
    description: str = Field(default="", description="Free text shown in listings.")


class RollbackRequest(BaseModel):
    alias: str = Field(default=STABLE, description="Alias to move back to its previous version.")


class RegisterRequest(BaseModel):
    name: str = Field(description="Adapter name to publish under.")
    source: str = Field(description="Object store URI of the adapter folder (s3://bucket/prefix).")
    description: str = Field(default="", description="Free text shown in listings.")


class VersionView(Manifest):
    """A published version and the engine tiers it is resident in now."""

    resident: list[str] = Field(description="Tiers holding this version: engine, cpu.")


class AdapterView(BaseModel):
    name: str = Field(description="Adapter name.")
    description: str = Field(description="Description given at push.")
    aliases: dict[str, int] = Field(description="Alias -> version.")
    versions: list[VersionView] = Field(description="Published versions, oldest first.")


class AdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdapterView]


class AliasView(BaseModel):
    name: str
    alias: str
    version: int = Field(description="The version the alias points at now.")


class DeletedVersion(BaseModel):
    name: str
    version: int
    deleted: Literal[True] = True


class LoadResult(BaseModel):
    model: str = Field(description="The version, as name@version.")
    found_in: str = Field(description="The fastest tier that held it: engine, cpu, disk, or store (fetched).")
    load_seconds: float


class EvictResult(BaseModel):
    model: str = Field(description="The version, as name@version.")
    evicted: bool = Field(description="False when it was not in the engine's caches.")
