"""Thin admin routes of virtual models (admin key): list them, and reload them from the tenants file."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.errors import OpenAIError, bad_request
from api.generation.virtual_model_table import GraphError
from api.tenancy.config import ConfigError, load_tenancy_config

graphs_router = APIRouter(prefix="/v1/virtual-models", tags=["admin"])


def _server(request: Request):
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    return server


def _listing(server) -> dict:
    return {"object": "list", "data": [{"id": name, **model.model_dump(exclude_none=True)}
                                       for name, model in sorted(server.graphs.table.snapshot().items())]}


@graphs_router.get("")
async def list_virtual_models(request: Request) -> JSONResponse:
    return JSONResponse(_listing(_server(request)))


@graphs_router.post("/reload")
async def reload_virtual_models(request: Request) -> JSONResponse:
    """Re-reads the `virtual_models` section of the tenants file (--config) and swaps it in whole; any problem
    (schema, unknown member, cycle, name clash) is a 400 listing all of them, and the current set stays."""
    server = _server(request)
    if server.config.serving.config is None:
        raise bad_request("The server runs without a tenants file (--config); there is nothing to reload.")
    try:
        models = load_tenancy_config(server.config.serving.config).virtual_models
        server.graphs.table.replace(models)
    except (ConfigError, GraphError) as e:
        raise OpenAIError(400, "The virtual models were not reloaded:\n" + "\n".join(e.problems),
                          code="invalid_config") from e
    return JSONResponse(_listing(server))
