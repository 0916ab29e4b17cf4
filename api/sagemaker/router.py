"""Thin routes of the container contract SageMaker (and others) expect: GET /ping and POST /invocations."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.body import read_json_object
from api.openai.router import run_generation
from api.ops.readiness import readiness
from api.pipeline.request import GenerationService
from api.sagemaker.protocol import CUSTOM_ATTRIBUTES_HEADER

sagemaker_router = APIRouter(tags=["sagemaker"])


@sagemaker_router.get("/ping")
async def ping(request: Request) -> JSONResponse:
    """200 when ready for traffic, 503 while starting or draining: the same answer as /ready."""
    server = request.app.state.server
    return JSONResponse(readiness(server.lifecycle, server.engine))


@sagemaker_router.post("/invocations")
async def invocations(request: Request) -> Response:
    """An OpenAI chat (`messages`) or completions (`prompt`) body, streamed when it says `stream: true`."""
    server = request.app.state.server

    async def parse() -> tuple[BaseModel, GenerationService]:
        payload = await read_json_object(request, server.config.input_limits.max_json_depth)
        return server.sagemaker.request_of(payload, request.headers.get(CUSTOM_ATTRIBUTES_HEADER))

    return await run_generation(request, parse)
