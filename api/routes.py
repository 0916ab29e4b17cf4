"""Thin HTTP routes: parse, hand to the serving object from app state, shape the response."""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from api.errors import OpenAIError, bad_request, from_validation_error, model_not_found
from api.metrics import STATUS_CLIENT_CLOSED
from api.protocol import ChatCompletionRequest, CompletionRequest

router = APIRouter()
Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    raw = await request.body()
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise from_validation_error(e) from e


async def _until_disconnect(request: Request, work):
    """Runs `work`; if the client goes away first, cancels it (which aborts its engine requests)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return Response(status_code=STATUS_CLIENT_CLOSED)


def _respond(result) -> Response:
    if isinstance(result, Response):
        return result
    if isinstance(result, BaseModel):
        return JSONResponse(result.model_dump(exclude_none=False))
    return StreamingResponse(result, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.catalog.model_list().model_dump())


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    for card in request.app.state.catalog.model_list().data:
        if card.id == model_id:
            return JSONResponse(card.model_dump())
    raise model_not_found(model_id)


async def _generate(request: Request, body_cls: type[Body], service) -> Response:
    try:
        body = await parse_body(request, body_cls)
    except OpenAIError as e:
        request.app.state.metrics.observe_rejected(e.status)
        raise
    return _respond(await _until_disconnect(request, service.create(body)))


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, ChatCompletionRequest, request.app.state.chat)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, CompletionRequest, request.app.state.completion)


@router.get("/health")
async def health(request: Request) -> Response:
    if not request.app.state.engine.is_alive():
        raise OpenAIError(503, "The engine is not running.", code="engine_dead")
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
