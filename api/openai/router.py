"""Thin routes of the OpenAI endpoints: parse, hand to the serving object from app state, shape the response."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from api.auth import Caller
from api.body import Body, parse_body, read_json_object, validate_body
from api.errors import OpenAIError
from api.generation.resolve import visibility_of
from api.middleware import request_id_of
from api.observability.outcome import STATUS_CLIENT_CLOSED, UNKNOWN
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.tokenize import DetokenizeRequest, tokenize_request_type
from api.pipeline.request import GenerationService, Reply

router = APIRouter()


async def _until_disconnect(request: Request, work: Awaitable[Reply]) -> Reply | Response:
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


class AccountedStream(StreamingResponse):
    """An SSE response that closes its request's account however sending ends, even when the client left
    before the first byte and the stream never started (its own close would then never run)."""

    def __init__(self, reply: Reply):
        super().__init__(reply.body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **reply.headers})
        self.account = reply.stream_account

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.account is not None:
                await self.account.close(STATUS_CLIENT_CLOSED)  # does nothing when the stream closed it


def _respond(reply: Reply | Response) -> Response:
    if isinstance(reply, Response):
        return reply
    if isinstance(reply.body, BaseModel):
        return JSONResponse(reply.body.model_dump(exclude_none=False), headers=reply.headers)
    return AccountedStream(reply)


def caller_of(request: Request) -> Caller:
    """The tenant behind the request's API key; 401 when a key is required and missing or wrong."""
    server = request.app.state.server
    return server.auth.caller(request.headers.get("authorization"))


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    server = request.app.state.server
    visibility = visibility_of(server.config.tenancy, caller_of(request))
    return JSONResponse(server.catalog.model_list(visibility).model_dump(exclude_none=True))


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    server = request.app.state.server
    card = server.catalog.model_card(model_id, visibility_of(server.config.tenancy, caller_of(request)))
    return JSONResponse(card.model_dump(exclude_none=True))


ParseBody = Callable[[], Awaitable[tuple[BaseModel, GenerationService]]]


async def run_generation(request: Request, parse: ParseBody) -> Response:
    """A generation route: the caller from its key, then `parse` (the body and the service that serves it, or
    the virtual model's graph over that service), then the work, cancelled if the client disconnects. A refusal
    before the work starts is counted."""
    server = request.app.state.server
    caller = None
    try:
        caller = caller_of(request)
        body, service = await parse()
        if server.graphs.serves(body.model):  # a virtual model (api/graphs): its runs go through `service`
            service = server.graphs.bound(service, body, caller)
    except OpenAIError as e:
        server.metrics.observe_rejected(e.status, tenant=caller.tenant if caller else UNKNOWN)
        raise
    with server.tracing.span("http.request", path=request.url.path, tenant=caller.tenant,
                             request_id=request_id_of(request.scope)):
        work = service.create(body, caller, request_id_of(request.scope))
        return _respond(await _until_disconnect(request, work))


async def _generate(request: Request, body_cls: type[Body], service: GenerationService[Body]) -> Response:
    async def parse() -> tuple[Body, GenerationService[Body]]:
        return await parse_body(request, body_cls, request.app.state.server.config.input_limits.max_json_depth), service

    return await run_generation(request, parse)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, ChatCompletionRequest, request.app.state.server.chat)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, CompletionRequest, request.app.state.server.completion)


@router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    server = request.app.state.server
    caller = caller_of(request)
    payload = await read_json_object(request, server.config.input_limits.max_json_depth)
    body = validate_body(payload, tokenize_request_type(payload))
    return JSONResponse((await server.tokenizing.tokenize(body, caller)).model_dump())


@router.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    server = request.app.state.server
    caller = caller_of(request)
    body = await parse_body(request, DetokenizeRequest, server.config.input_limits.max_json_depth)
    return JSONResponse((await server.tokenizing.detokenize(body, caller)).model_dump())


BODIES = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}


def document_bodies(schema: dict) -> dict:
    """The OpenAPI schema with the generation routes' request bodies, which they parse themselves (to apply the
    input limits before validation), so FastAPI cannot see them."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    return schema
