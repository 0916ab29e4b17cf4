"""The FastAPI app: its lifespan owns the engine; every error leaves as one OpenAI-shaped body."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.catalog import ModelCatalog
from api.errors import OpenAIError, from_http_status
from api.metrics import ServerMetrics
from api.middleware import RequestIdMiddleware
from api.routes import router
from api.serving_chat import ChatService
from api.serving_completion import CompletionService
from engine.types import EngineClient

logger = logging.getLogger(__name__)


def _error_response(e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _on_openai_error(request: Request, e: OpenAIError) -> JSONResponse:
    return _error_response(e)


async def _on_http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    return _error_response(from_http_status(e.status_code, str(e.detail) if e.detail else None))


async def _on_validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
    return _error_response(OpenAIError(400, f"Invalid request: {e.errors()}", code="invalid_value"))


async def _on_unexpected(request: Request, e: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s", request.url.path)
    return _error_response(OpenAIError(500, "Internal server error.", code="internal_error"))


def create_app(engine: EngineClient, catalog: ModelCatalog) -> FastAPI:
    """`engine` is started by the lifespan and shut down when the app stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.shutdown()

    app = FastAPI(title="loraplex", lifespan=lifespan)
    metrics = ServerMetrics(engine)
    app.state.engine = engine
    app.state.catalog = catalog
    app.state.metrics = metrics
    app.state.chat = ChatService(engine, catalog, metrics)
    app.state.completion = CompletionService(engine, catalog, metrics)
    app.include_router(router)
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_middleware(RequestIdMiddleware)
    return app
