"""The Open Inference Protocol's GRPCInferenceService over the server's own parts: a ModelInfer is a completions
request through the same pipeline as HTTP (the tenant from `authorization` metadata, model resolution, rollouts,
limits, admission, adapter loading, billing, metrics and traces). Errors are gRPC status codes carrying the HTTP
error's message; cancelling a call aborts its engine request."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from importlib import metadata

import grpc

from api.body import validate_body
from api.errors import OpenAIError, bad_request
from api.generation.resolve import visibility_of
from api.grpc import inference_pb2 as pb
from api.grpc.inference_pb2_grpc import GRPCInferenceServiceServicer
from api.grpc.tensors import FINAL_FLAG, INPUT_TYPES, TEXT_OUTPUT, InferCall, infer_call, text_response
from api.observability.outcome import STATUS_CLIENT_CLOSED, UNKNOWN
from api.openai.protocol import CompletionRequest, CompletionResponse
from api.pipeline.request import Reply
from api.server.holder import Server

CODE_BY_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                  403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
                  413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
                  429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED,
                  503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
PLATFORM = "loraplex"


def status_code_of(e: OpenAIError) -> grpc.StatusCode:
    return CODE_BY_STATUS.get(e.status, grpc.StatusCode.INTERNAL)


def error_metadata(e: OpenAIError) -> tuple[tuple[str, str], ...]:
    """The HTTP error's code, param and headers (`retry-after`) as trailing metadata."""
    pairs = [("loraplex-error-code", e.code or ""), ("loraplex-error-param", e.param or "")]
    return tuple((k, v) for k, v in pairs if v) + tuple((k.lower(), v) for k, v in e.headers.items())


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    return dict(context.invocation_metadata() or ()).get("authorization")


def _sse_texts(line: str) -> tuple[str, OpenAIError | None]:
    """The text of one SSE event of a completions stream, or the error it carries."""
    payload = json.loads(line.removeprefix("data: ").strip())
    if "error" in payload:
        error = payload["error"]
        return "", OpenAIError(500, error.get("message", "generation failed"), code=error.get("code"))
    return "".join(choice["text"] for choice in payload.get("choices", ())), None


class InferenceServicer(GRPCInferenceServiceServicer):
    def __init__(self, server: Server):
        self.server = server

    async def _fail(self, context: grpc.aio.ServicerContext, e: OpenAIError, tenant: str = UNKNOWN) -> None:
        self.server.metrics.observe_rejected(e.status, tenant=tenant)
        context.set_trailing_metadata(error_metadata(e))
        await context.abort(status_code_of(e), e.message)

    # --- health and metadata --------------------------------------------------------------------------------------

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        lifecycle = self.server.lifecycle
        return pb.ServerReadyResponse(ready=lifecycle.ready and not lifecycle.draining)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name=PLATFORM, version=metadata.version("loraplex"), extensions=[])

    def _card(self, name: str, version: str, context: grpc.aio.ServicerContext):
        caller = self.server.auth.caller(_authorization(context))
        model = f"{name}@{version}" if version else name
        return self.server.catalog.model_card(model, visibility_of(self.server.config.tenancy, caller))

    async def ModelReady(self, request, context):
        try:
            self._card(request.name, request.version, context)
        except OpenAIError as e:
            if e.status != 404:
                await self._fail(context, e)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.server.lifecycle.ready and not self.server.lifecycle.draining)

    async def ModelMetadata(self, request, context):
        try:
            card = self._card(request.name, request.version, context)
        except OpenAIError as e:
            await self._fail(context, e)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name, versions=[str(v) for v in card.versions or ()], platform=PLATFORM,
            inputs=[tensor(name=name, datatype=datatype, shape=[1]) for name, datatype in INPUT_TYPES.items()],
            outputs=[tensor(name=TEXT_OUTPUT, datatype="BYTES", shape=[-1])])

    # --- inference ------------------------------------------------------------------------------------------------

    async def _start(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext,
                     streamed: bool) -> tuple[InferCall, Reply]:
        """The call parsed and run through the pipeline (admitted; a stream's reply not yet read). Raises
        OpenAIError."""
        server = self.server
        caller = server.auth.caller(_authorization(context))
        call = infer_call(request)
        if call.stream != streamed:
            raise bad_request("stream true needs ModelStreamInfer; ModelInfer returns the whole text"
                              if call.stream else "ModelStreamInfer needs the input stream set true",
                              param="stream")
        if server.graphs.serves(call.body["model"]):
            raise bad_request(f"{call.body['model']!r} is a virtual model; they are served over HTTP only.",
                              param="model_name", code="unsupported_model")
        req = validate_body(call.body, CompletionRequest)
        request_id = request.id or f"grpc-{uuid.uuid4().hex}"
        with server.tracing.span("grpc.request", tenant=caller.tenant, request_id=request_id):
            return call, await server.completion.create(req, caller, request_id)

    async def ModelInfer(self, request, context):
        try:
            call, reply = await self._start(request, context, streamed=False)
        except OpenAIError as e:
            return await self._fail(context, e)
        response: CompletionResponse = reply.body
        context.set_trailing_metadata(tuple((k.lower(), v) for k, v in reply.headers.items()))
        text = response.choices[0].text
        return text_response(request, text if call.exclude_input else call.prompt + text)

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            async for response in self._stream_one(request, context):
                yield response

    async def _stream_one(self, request: pb.ModelInferRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """One response per chunk of text, the last flagged final (or an empty final one when asked); a failure
        is an `error_message` response, as Triton sends it, and the stream goes on with the next request."""
        try:
            call, reply = await self._start(request, context, streamed=True)
        except OpenAIError as e:
            self.server.metrics.observe_rejected(e.status)
            yield pb.ModelStreamInferResponse(error_message=f"{status_code_of(e).name}: {e.message}")
            return
        try:
            async for response in self._chunks(request, call, reply.body):
                yield response
        finally:
            await reply.stream_account.close(STATUS_CLIENT_CLOSED)  # nothing when the stream closed it

    async def _chunks(self, request: pb.ModelInferRequest, call: InferCall,
                      lines: AsyncIterator[str]) -> AsyncIterator[pb.ModelStreamInferResponse]:
        pending = "" if call.exclude_input else call.prompt
        held: str | None = None  # the text of the previous chunk: sent once it is known not to be the last
        async for line in lines:
            if not line.startswith("data: ") or line.startswith("data: [DONE]"):
                continue
            text, error = _sse_texts(line)
            if error is not None:
                yield pb.ModelStreamInferResponse(error_message=f"{status_code_of(error).name}: {error.message}")
                return
            if held is not None:
                yield pb.ModelStreamInferResponse(infer_response=text_response(request, held, final=False))
            held, pending = pending + text, ""
        last = held if held is not None else pending
        if call.empty_final:
            yield pb.ModelStreamInferResponse(infer_response=text_response(request, last, final=False))
            empty = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version,
                                          id=request.id)
            empty.parameters[FINAL_FLAG].bool_param = True
            yield pb.ModelStreamInferResponse(infer_response=empty)
        else:
            yield pb.ModelStreamInferResponse(infer_response=text_response(request, last, final=True))
