"""Thin routes of the Responses API: create (through the generation route's steps), retrieve and delete stored
responses of the caller's tenant."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from api.body import parse_body
from api.errors import bad_request
from api.openai.router import caller_of, run_generation
from api.responses.protocol import ResponsesRequest
from api.responses.serving import ResponsesService, ResponseTurn, response_not_found

router = APIRouter()


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    server = request.app.state.server
    service: ResponsesService = server.responses

    async def parse() -> tuple[ResponseTurn, ResponsesService]:
        body = await parse_body(request, ResponsesRequest, server.config.input_limits.max_json_depth)
        if server.graphs.serves(body.model):
            raise bad_request(f"{body.model!r} is a virtual model; they serve chat and completions only.",
                              param="model", code="unsupported_model")
        return await service.turn(body, caller_of(request)), service

    return await run_generation(request, parse)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> JSONResponse:
    server = request.app.state.server
    caller = caller_of(request)
    stored = await asyncio.to_thread(server.responses.store.get, caller.tenant, response_id)
    if stored is None:
        raise response_not_found(response_id, "response_id")
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    server = request.app.state.server
    caller = caller_of(request)
    if not await asyncio.to_thread(server.responses.store.delete, caller.tenant, response_id):
        raise response_not_found(response_id, "response_id")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
