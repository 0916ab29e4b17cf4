"""Thin routes of async jobs: POST /v1/async/chat/completions and /v1/async/completions, GET /v1/async/{id}."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.body import read_json_object
from api.jobs.serving import JobService
from api.openai.router import caller_of

jobs_router = APIRouter()


def _service(request: Request) -> JobService:
    return request.app.state.server.jobs


async def _submit(request: Request, endpoint: str) -> JSONResponse:
    caller = caller_of(request)
    payload = await read_json_object(request, request.app.state.server.config.input_limits.max_json_depth)
    job = await _service(request).submit(caller, endpoint, payload)
    return JSONResponse(job.model_dump(), status_code=202)


@jobs_router.post("/v1/async/chat/completions")
async def submit_chat(request: Request) -> JSONResponse:
    return await _submit(request, "/v1/chat/completions")


@jobs_router.post("/v1/async/completions")
async def submit_completion(request: Request) -> JSONResponse:
    return await _submit(request, "/v1/completions")


@jobs_router.get("/v1/async/{job_id}")
async def retrieve_job(job_id: str, request: Request) -> JSONResponse:
    return JSONResponse(_service(request).retrieve(caller_of(request), job_id).model_dump())
