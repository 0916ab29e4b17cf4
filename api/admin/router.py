"""Thin routes of the admin API for the adapter registry, guarded by the admin key."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from api.admin.protocol import (
    AdapterList,
    AdapterView,
    AliasView,
    ComposeRequest,
    DeletedVersion,
    EvictResult,
    LoadResult,
    PromoteRequest,
    RegisterRequest,
    RollbackRequest,
    VersionView,
)
from api.admin.serving import AdminService
from api.body import parse_body
from api.errors import bad_request

admin_router = APIRouter(prefix="/v1/adapters", tags=["admin"])

ARCHIVE_TYPES = {"application/zip", "application/x-tar", "application/gzip", "application/x-gzip",
                 "application/octet-stream"}


def admin_service(request: Request) -> AdminService:
    """The admin service, for the admin key only (checked before the body is validated)."""
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    return server.admin


Admin = Depends(admin_service)


@admin_router.get("", response_model=AdapterList)
async def list_adapters(admin: AdminService = Admin) -> AdapterList:
    return admin.list()


@admin_router.post("", response_model=VersionView, status_code=201)
async def publish_adapter(request: Request, admin: AdminService = Admin) -> VersionView:
    """Either an archive body (tar, tar.gz or zip; `?name=` and `?description=`) or JSON
    `{"name", "source", "description"}` (RegisterRequest) naming a store URI to copy the adapter from."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type in ARCHIVE_TYPES:
        name = request.query_params.get("name")
        if not name:
            raise bad_request("?name= is required with an archive upload.", param="name")
        return await admin.upload(await request.body(), name, request.query_params.get("description", ""))
    body = await parse_body(request, RegisterRequest, request.app.state.server.config.input_limits.max_json_depth)
    return await admin.register(body.source, body.name, body.description)


@admin_router.get("/{name}", response_model=AdapterView)
async def get_adapter(name: str, admin: AdminService = Admin) -> AdapterView:
    return admin.get(name)


@admin_router.post("/{name}/compose", response_model=VersionView, status_code=201)
async def compose(name: str, request: Request, admin: AdminService = Admin) -> VersionView:
    """Publishes a weighted mixture of published versions as the next version of `name` (exact; the manifest's
    `lineage` records the components)."""
    body = await parse_body(request, ComposeRequest, request.app.state.server.config.input_limits.max_json_depth)
    return await admin.compose(name, [(p.model, p.weight) for p in body.components], body.description)


@admin_router.post("/{name}/promote", response_model=AliasView)
async def promote(name: str, body: PromoteRequest, admin: AdminService = Admin) -> AliasView:
    return await admin.promote(name, body.version, body.alias)


@admin_router.post("/{name}/rollback", response_model=AliasView)
async def rollback(name: str, body: RollbackRequest | None = None, admin: AdminService = Admin) -> AliasView:
    return admin.rollback(name, (body or RollbackRequest()).alias)


@admin_router.delete("/{name}/versions/{version}", response_model=DeletedVersion)
async def delete_version(name: str, version: int, admin: AdminService = Admin) -> DeletedVersion:
    return admin.delete(name, version)


@admin_router.post("/{ref}/load", response_model=LoadResult)
async def load(ref: str, admin: AdminService = Admin) -> LoadResult:
    return await admin.load(admin.resolve(ref))


@admin_router.post("/{ref}/evict", response_model=EvictResult)
async def evict(ref: str, admin: AdminService = Admin) -> EvictResult:
    return await admin.evict(admin.resolve(ref))
