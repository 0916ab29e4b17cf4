"""Request bodies: JSON parsed and validated into a pydantic model, every problem in one OpenAI-shaped 400."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from api.errors import bad_request, from_validation_error

Body = TypeVar("Body", bound=BaseModel)


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; 400 when it is not JSON or not an object."""
    raw = await request.body()
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return payload


async def parse_body(request: Request, model: type[Body]) -> Body:
    payload = await read_json_object(request)
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise from_validation_error(e) from e
