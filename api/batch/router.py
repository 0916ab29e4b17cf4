"""Thin routes of /v1/files and /v1/batches: the caller from its key, the service from app state."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from api.batch.protocol import BatchCreateRequest
from api.batch.serving import BatchService
from api.body import decode_body
from api.errors import bad_request
from api.openai.router import caller_of

batch_router = APIRouter()
FILES_PATH = "/v1/files"


def _service(request: Request) -> BatchService:
    return request.app.state.server.batches


def _json(model) -> JSONResponse:
    return JSONResponse(model.model_dump(exclude_none=False))


@batch_router.post(FILES_PATH)
async def upload_file(request: Request) -> JSONResponse:
    caller = caller_of(request)
    form = await request.form(max_files=1, max_fields=8)
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise bad_request("A multipart field 'file' holding the JSONL file is required.", param="file")
        if not isinstance(purpose, str):
            raise bad_request("The field 'purpose' is required ('batch').", param="purpose")
        content = await upload.read()
        return _json(_service(request).upload(caller, upload.filename or "", purpose, content))
    finally:
        await form.close()


@batch_router.get(FILES_PATH)
async def list_files(request: Request) -> JSONResponse:
    return _json(_service(request).files(caller_of(request)))


@batch_router.get(FILES_PATH + "/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> JSONResponse:
    return _json(_service(request).file(caller_of(request), file_id))


@batch_router.get(FILES_PATH + "/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    return Response(_service(request).content(caller_of(request), file_id), media_type="application/jsonl")


@batch_router.delete(FILES_PATH + "/{file_id}")
async def delete_file(file_id: str, request: Request) -> JSONResponse:
    return _json(_service(request).delete(caller_of(request), file_id))


@batch_router.post("/v1/batches")
async def create_batch(request: Request) -> JSONResponse:
    caller = caller_of(request)
    limits = request.app.state.server.config.input_limits
    body = decode_body(await request.body(), BatchCreateRequest, limits.max_json_depth)
    return _json(_service(request).create(caller, body))


@batch_router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> JSONResponse:
    return _json(_service(request).list(caller_of(request), after, limit))


@batch_router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> JSONResponse:
    return _json(_service(request).retrieve(caller_of(request), batch_id))


@batch_router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> JSONResponse:
    return _json(_service(request).cancel(caller_of(request), batch_id))
