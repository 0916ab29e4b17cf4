"""Plain ASGI middleware: request ids, and the request body size limit."""

from __future__ import annotations

import json
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import OpenAIError

HEADER = b"x-request-id"
_VALID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_of(scope: Scope) -> str:
    return scope.get("state", {}).get("request_id", "")


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(HEADER, b"")
        request_id = given.decode() if _VALID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                headers.append((HEADER, request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyLimitMiddleware:
    """A body over its limit gets a 413 before the app reads it whole: the declared Content-Length is
    checked first, and the bytes actually received are counted (a chunked body declares none). A POST to
    one of `uploads` (adapter archives, batch files) has its own, larger limit."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, uploads: dict[str, int]):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.uploads = uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = self.uploads.get(scope["path"]) if scope["method"] == "POST" else None
        limit = upload if upload is not None else self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _too_large(limit, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise body_too_large(limit)  # the app's OpenAIError handler answers it
            return message

        await self.app(scope, counting_receive, send)


def body_too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")


async def _too_large(limit: int, send: Send) -> None:
    body = json.dumps(body_too_large(limit).body()).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
