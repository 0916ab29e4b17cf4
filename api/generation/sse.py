"""Server-sent events: how a streamed response is framed, and where its account closes."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from pydantic import BaseModel

from api.errors import OpenAIError
from api.generation.accounting import RequestAccount
from api.observability.outcome import STATUS_CLIENT_CLOSED

logger = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"


def sse(payload: BaseModel | dict) -> str:
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {body}\n\n"


async def framed_stream(events: AsyncIterator[str], account: RequestAccount) -> AsyncIterator[str]:
    """SSE lines of a response, ended by [DONE]; an error after the start becomes an error event.

    The account closes (and the usage ledger commits) before [DONE], the response's last bytes.
    """
    status = STATUS_CLIENT_CLOSED  # unless the stream ends otherwise: the client went away
    try:
        try:
            async for line in events:
                yield line
            status = 200
        except OpenAIError as e:
            status = e.status
            yield sse(e.body())
        except Exception:  # a bug mid-stream: the client gets an error event, the request its record
            logger.exception("stream of request %s failed", account.request_id)
            status = 500
            yield sse(OpenAIError(500, "Internal server error.", code="internal_error").body())
    finally:
        await account.close(status)
    yield SSE_DONE
