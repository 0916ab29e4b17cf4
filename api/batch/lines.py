"""A batch line's request through the live pipeline, and its result as an output or error file line."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from api.auth import Caller
from api.batch.protocol import LineError, LineResponse, OutputLine
from api.errors import bad_request, from_validation_error
from api.pipeline.request import BatchLane, Reply


class QueuedService(Protocol):
    """What runs queued work: a `GenerationService`, or one that serves virtual models too
    (`api.graphs.serving.GraphDispatch`)."""

    async def check(self, req: Any, caller: Caller) -> int: ...

    async def create(self, req: Any, caller: Caller, request_id: str, lane: BatchLane | None = None) -> Reply: ...


@dataclass(frozen=True)
class Endpoint:
    """What serves one batch `endpoint`: the body model its lines are parsed with and the service."""

    body: type[BaseModel]
    service: QueuedService


Endpoints = Mapping[str, Endpoint]


def parse_request(endpoint: Endpoint, body: dict[str, Any]) -> BaseModel:
    """A line's body as the endpoint's request; a 400 as a live request would get it. Lines do not stream."""
    try:
        req = endpoint.body.model_validate(body)
    except ValidationError as e:
        raise from_validation_error(e) from e
    if getattr(req, "stream", False):
        raise bad_request("stream is not supported in a batch line.", param="stream")
    return req


async def check_line(endpoint: Endpoint, body: dict[str, Any], caller: Caller) -> int:
    """The line's request as `create` would check it (body, model for this tenant, prompt and output budget);
    returns its tokens, prompt plus output budget."""
    return await endpoint.service.check(parse_request(endpoint, body), caller)


def billing_key(batch_id: str, line: int) -> str:
    """The usage ledger's key of a line: however often it runs, it is billed once."""
    return f"{batch_id}:{line}"


def output_line(batch_id: str, row: dict) -> str:
    """One finished line (a `BatchStore.finished_lines` row) in OpenAI's output/error file format."""
    line_id = "batch_req_" + hashlib.sha256(f"{batch_id}:{row['line']}".encode()).hexdigest()[:24]
    if row["state"] in ("done", "failed"):
        response = LineResponse(status_code=row["status"], request_id=row["request_id"],
                                body=json.loads(row["response"]))
        out = OutputLine(id=line_id, custom_id=row["custom_id"], response=response)
    else:
        message = ("The batch was cancelled before this request ran." if row["state"] == "cancelled" else
                   "This request could not be executed before the completion window expired.")
        out = OutputLine(id=line_id, custom_id=row["custom_id"], response=None,
                         error=LineError(code=f"batch_{row['state']}", message=message))
    return out.model_dump_json()
