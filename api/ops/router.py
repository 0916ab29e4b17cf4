"""Operator routes: liveness, readiness, metrics, the dashboard, drift reference windows and usage."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from api.errors import OpenAIError, bad_request
from api.observability.dashboard import DASHBOARD_HTML, STATIC_DIR
from api.observability.history_json import history_json
from api.observability.plotly_asset import plotly_js_path
from api.ops.readiness import liveness, readiness
from api.ops.usage import usage_filters, usage_limit

ops_router = APIRouter(tags=["operations"])
PLOTLY_JS = plotly_js_path()  # at import, so a missing plotly fails at start with its message
MAX_GROUP_CHARS = 300


@ops_router.get("/health")
async def health(request: Request) -> Response:
    """Alive: the process answers and the engine has not died."""
    return JSONResponse(liveness(request.app.state.server.engine))


@ops_router.get("/ready")
async def ready(request: Request) -> Response:
    """Ready for traffic: engine started and model loaded, not draining."""
    server = request.app.state.server
    return JSONResponse(readiness(server.lifecycle, server.engine))


@ops_router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition; the admin key or a metrics key when tenants are configured. `name[]` (repeatable,
    as Prometheus' `params` send it) keeps only those samples, e.g. `?name[]=loraplex_engine_running_requests`."""
    server = request.app.state.server
    server.auth.metrics_reader(request.headers.get("authorization"))
    names = request.query_params.getlist("name[]")
    return Response(server.metrics.render(names), media_type=CONTENT_TYPE_LATEST)


@ops_router.get("/dashboard")
async def dashboard(request: Request) -> Response:
    return FileResponse(DASHBOARD_HTML, media_type="text/html")


@ops_router.get("/dashboard/history")
def dashboard_history(request: Request, resolution: str = "10s", group: str | None = None) -> JSONResponse:
    """Charts' data (admin key when tenants are configured); a plain def, so it runs in a worker thread."""
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    if group is not None and len(group) > MAX_GROUP_CHARS:
        raise bad_request(f"group is longer than {MAX_GROUP_CHARS} characters.", param="group")
    try:
        return JSONResponse(history_json(server.history, resolution, group, time.time()))
    except ValueError as e:
        raise bad_request(str(e), param="resolution") from e


@ops_router.get("/dashboard/plotly.min.js")
async def plotly_js(request: Request) -> Response:
    """The charting library, from the installed plotly package: the page works offline."""
    return FileResponse(PLOTLY_JS, media_type="text/javascript")


@ops_router.get("/dashboard/{asset}")
async def dashboard_asset(asset: str, request: Request) -> Response:
    if asset == "data":
        server = request.app.state.server
        server.auth.admin(request.headers.get("authorization"))
        return JSONResponse(server.dashboard.data())
    files = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()}
    if asset not in files:
        raise OpenAIError(404, f"No dashboard asset {asset!r}.", code="not_found")
    return FileResponse(files[asset])


@ops_router.get("/v1/usage")
async def usage(request: Request) -> Response:
    """A tenant sees its own usage; the admin key sees everyone's (filter with ?tenant=)."""
    server = request.app.state.server
    caller = server.auth.principal(request.headers.get("authorization"))
    filters = usage_filters(dict(request.query_params), caller)
    records = server.ledger.query(**filters, limit=usage_limit(request.query_params.get("limit", "100")))
    summary = server.ledger.summary(**filters)
    return JSONResponse({"object": "usage", "filters": filters, "summary": summary, "data": records})


@ops_router.post("/v1/drift/{model}/pin")
async def pin_drift_reference(model: str, request: Request) -> JSONResponse:
    """Admin key: the current window of `model` (NAME@VERSION, or the base model id) becomes its drift
    reference; later sequences fill a new current window. 404 while the version has no current window."""
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    name, at, version = model.rpartition("@")
    name, version = (name, version) if at else (model, "")
    try:
        size = server.drift.pin(name, version)
    except KeyError as e:
        raise OpenAIError(404, f"No drift window of {model!r} to pin yet: it has not served past its reference "
                          "window.", param="model", code="not_found") from e
    return JSONResponse({"model": name, "version": version, "reference": size, "pinned": True})
