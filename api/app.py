"""The FastAPI app: its lifespan owns the engine; every error leaves as one OpenAI-shaped body."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.admin.router import admin_router
from api.batch.router import FILES_PATH, batch_router
from api.errors import OpenAIError, from_http_status, from_validation_error
from api.graphs.router import graphs_router
from api.grpc.front import GrpcFront
from api.jobs.router import jobs_router
from api.middleware import BodyLimitMiddleware, RequestIdMiddleware
from api.openai.router import document_bodies, router
from api.ops.cluster import cluster_router
from api.ops.router import ops_router
from api.responses.router import router as responses_router
from api.routing.router import routing_router
from api.sagemaker.router import sagemaker_router
from api.server import running
from api.server.holder import Server

logger = logging.getLogger(__name__)


def _error_response(e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)


async def _on_openai_error(request: Request, e: OpenAIError) -> JSONResponse:
    return _error_response(e)


async def _on_http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    return _error_response(from_http_status(e.status_code, str(e.detail) if e.detail else None))


async def _on_validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
    return _error_response(from_validation_error(e))


async def _on_unexpected(request: Request, e: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s", request.url.path)
    return _error_response(OpenAIError(500, "Internal server error.", code="internal_error"))


_SETTLE_S = 5.0
MULTIPART_OVERHEAD_BYTES = 64 * 1024  # the form's other fields and boundaries around an uploaded file


def create_app(server: Server, grpc_front: GrpcFront | None = None) -> FastAPI:
    """`server.engine` is started by the lifespan and shut down when the app stops; `grpc_front`, when given,
    serves beside HTTP from the engine's start until the app stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.engine.start()
        try:
            await running.start(server)
            if grpc_front is not None:
                port = await grpc_front.start()
                host = grpc_front.address.rsplit(":", 1)[0]
                logger.info("gRPC (Open Inference Protocol v2) on %s:%d", host, port)
            yield
        finally:
            server.lifecycle.ready = False
            if grpc_front is not None:
                await grpc_front.stop(_SETTLE_S)
            server.loops.stop()
            # Requests uvicorn cancelled at shutdown close their accounts (ledger records) on their next step.
            await server.lifecycle.wait_idle(_SETTLE_S)
            server.engine.shutdown()
            running.close(server)

    app = FastAPI(title="loraplex", lifespan=lifespan)

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = document_bodies(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.state.server = server
    app.include_router(router)
    app.include_router(responses_router)
    app.include_router(admin_router)
    app.include_router(ops_router)
    app.include_router(routing_router)
    app.include_router(sagemaker_router)
    app.include_router(graphs_router)
    app.include_router(batch_router)
    app.include_router(jobs_router)
    app.include_router(cluster_router)
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=server.config.input_limits.max_body_bytes,
                       uploads={admin_router.prefix: server.config.serving.max_upload_bytes,
                                FILES_PATH: server.config.batch.files_max_bytes + MULTIPART_OVERHEAD_BYTES})
    app.add_middleware(RequestIdMiddleware)
    app.openapi = openapi
    return app
