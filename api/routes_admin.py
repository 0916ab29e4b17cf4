"""Admin routes for the adapter registry, guarded by the admin key."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.errors import bad_request

admin_router = APIRouter(prefix="/v1/adapters")

ARCHIVE_TYPES = {"application/zip", "application/x-tar", "application/gzip", "application/x-gzip",
                 "application/octet-stream"}


def _admin(request: Request):
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    return server.admin


async def _json(request: Request) -> dict:
    raw = await request.body()
    try:
        payload = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return payload


def _field(payload: dict, name: str, kind: type, default=None):
    value = payload.get(name, default)
    if value is None or not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise bad_request(f"'{name}' must be a {kind.__name__}.", param=name)
    return value


@admin_router.get("")
async def list_adapters(request: Request) -> JSONResponse:
    return JSONResponse(_admin(request).list())


@admin_router.post("")
async def publish_adapter(request: Request) -> JSONResponse:
    """Either an archive body (tar, tar.gz or zip; `?name=` and `?description=`) or JSON
    `{"name", "source", "description"}` naming a store URI to copy the adapter from."""
    admin = _admin(request)
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type in ARCHIVE_TYPES:
        name = request.query_params.get("name")
        if not name:
            raise bad_request("?name= is required with an archive upload.", param="name")
        body = await admin.upload(await request.body(), name, request.query_params.get("description", ""))
    else:
        payload = await _json(request)
        body = await admin.register(_field(payload, "source", str), _field(payload, "name", str),
                                    _field(payload, "description", str, ""))
    return JSONResponse(body, status_code=201)


@admin_router.get("/{name}")
async def get_adapter(name: str, request: Request) -> JSONResponse:
    return JSONResponse(_admin(request).get(name))


@admin_router.post("/{name}/promote")
async def promote(name: str, request: Request) -> JSONResponse:
    admin = _admin(request)
    payload = await _json(request)
    return JSONResponse(await admin.promote(name, _field(payload, "version", int),
                                            _field(payload, "alias", str, "stable")))


@admin_router.post("/{name}/rollback")
async def rollback(name: str, request: Request) -> JSONResponse:
    admin = _admin(request)
    payload = await _json(request)
    return JSONResponse(admin.rollback(name, _field(payload, "alias", str, "stable")))


@admin_router.delete("/{name}/versions/{version}")
async def delete_version(name: str, version: int, request: Request) -> JSONResponse:
    return JSONResponse(_admin(request).delete(name, version))


@admin_router.post("/{ref}/load")
async def load(ref: str, request: Request) -> JSONResponse:
    admin = _admin(request)
    return JSONResponse(await admin.load(admin.resolve(ref)))


@admin_router.post("/{ref}/evict")
async def evict(ref: str, request: Request) -> JSONResponse:
    admin = _admin(request)
    return JSONResponse(await admin.evict(admin.resolve(ref)))
