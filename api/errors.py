"""The one error model: every failure leaves the server as an OpenAI-shaped body with the right status."""

from __future__ import annotations

import math
from http import HTTPStatus

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """Raised anywhere in serving code; the routes turn it into `ErrorResponse` with `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        return _TYPE_BY_STATUS.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404, f"The model '{model}' does not exist or you do not have access to it.",
        param="model", code="model_not_found",
    )


def unauthorized(message: str = "Incorrect API key provided.") -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def rate_limited(message: str, headers: dict[str, str]) -> OpenAIError:
    return OpenAIError(429, message, code="rate_limit_exceeded", headers=headers)


def overloaded(message: str, retry_after: float) -> OpenAIError:
    seconds = max(1, math.ceil(retry_after))
    return OpenAIError(503, message, code="overloaded", headers={"Retry-After": str(seconds)})


def from_http_status(status: int, message: str | None = None) -> OpenAIError:
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return OpenAIError(status, message or phrase, code=phrase.lower().replace(" ", "_"))


def _loc_to_param(loc: tuple) -> str:
    """`("body", "messages", 0, "role")` -> `messages[0].role`; FastAPI's leading body/path/query is dropped."""
    if loc and loc[0] in ("body", "path", "query", "header"):
        loc = loc[1:]
    parts = [str(p) for p in loc]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def from_validation_error(e: ValidationError | RequestValidationError) -> OpenAIError:
    """Every schema violation in one message; `param` names the first."""
    errors = list(e.errors())
    problems = []
    for err in errors:
        param = _loc_to_param(tuple(err["loc"]))
        problems.append(f"{param or 'body'}: {err['msg']}")
    first = _loc_to_param(tuple(errors[0]["loc"])) if errors else None
    return bad_request("Invalid request: " + "; ".join(problems), param=first or None)
