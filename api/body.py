"""Request bodies: JSON parsed and validated into a pydantic model, every problem in one OpenAI-shaped 400.

Refused before validation: invalid JSON, a body that is not an object, nesting deeper than the limit,
NaN and Infinity (JSON has neither), and text holding lone UTF-16 surrogates (`"\\ud800"`), which no
tokenizer can encode. Large bodies are parsed in a worker thread so other streams keep flowing.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from api.errors import bad_request, from_validation_error

Body = TypeVar("Body", bound=BaseModel)
# Above this many bytes a body is parsed off the event loop.
OFF_LOOP_BYTES = 64 * 1024
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects in `raw`, brackets inside strings skipped."""
    depth = deepest = 0
    for match in _TOKENS.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets > max_depth and json_depth(raw) > max_depth:
        raise bad_request(f"The request body nests deeper than {max_depth} levels.", code="invalid_json")
    try:
        payload = json.loads(raw, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    if b"\\u" in raw:  # only escapes can smuggle a lone surrogate into valid UTF-8
        try:
            json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise bad_request("The request body holds text that is not valid Unicode (a lone UTF-16 surrogate "
                              "escape such as \\ud800).", code="invalid_text") from e
    return payload


def validate_body(payload: dict[str, Any], model: type[Body]) -> Body:
    """A decoded body as `model`, or one 400 listing every problem."""
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise from_validation_error(e) from e


def decode_body(raw: bytes, model: type[Body], max_depth: int) -> Body:
    return validate_body(decode_json(raw, max_depth), model)


async def read_json_object(request: Request, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object, for callers that pick the model to validate it with by its content."""
    raw = await request.body()
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(decode_json, raw, max_depth)
    return decode_json(raw, max_depth)


async def parse_body(request: Request, model: type[Body], max_depth: int) -> Body:
    raw = await request.body()
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(decode_body, raw, model, max_depth)
    return decode_body(raw, model, max_depth)
