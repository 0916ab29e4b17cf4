"""POST /invocations: the body becomes the OpenAI chat or completions request it has the shape of, served by the
same services as /v1/chat/completions and /v1/completions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from api.errors import bad_request, from_validation_error
from api.pipeline.request import GenerationService
from api.openai.chat import ChatService
from api.openai.completion import CompletionService
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.sagemaker.protocol import (
    CUSTOM_ATTRIBUTES_HEADER,
    MODEL_ATTRIBUTE,
    InvocationKind,
    invocation_kind,
    parse_custom_attributes,
)


class InvocationService:
    """Picks the request type and the service by the body's shape, and the model by the body's `model`, else
    the custom attributes' `model=NAME`, else the base model."""

    def __init__(self, chat: ChatService, completion: CompletionService, base_model: str):
        self._routes: dict[InvocationKind, tuple[type[BaseModel], GenerationService]] = {
            InvocationKind.CHAT: (ChatCompletionRequest, chat),
            InvocationKind.COMPLETION: (CompletionRequest, completion),
        }
        self.base_model = base_model

    def request_of(self, payload: dict[str, Any], custom_attributes: str | None) -> tuple[BaseModel, GenerationService]:
        try:
            kind = invocation_kind(payload)
        except ValueError as e:
            raise bad_request(str(e), code="invalid_invocation") from e
        body_cls, service = self._routes[kind]
        try:
            body = body_cls.model_validate({**payload, "model": self.model_of(payload, custom_attributes)})
        except ValidationError as e:
            raise from_validation_error(e) from e
        return body, service

    def model_of(self, payload: dict[str, Any], custom_attributes: str | None) -> Any:
        """The body's `model` as it is (its validation reports a wrong type), else the header's, else the base."""
        if payload.get("model") is not None:
            return payload["model"]
        try:
            attributes = parse_custom_attributes(custom_attributes)
        except ValueError as e:
            raise bad_request(f"{CUSTOM_ATTRIBUTES_HEADER}: {e}", param=CUSTOM_ATTRIBUTES_HEADER,
                              code="invalid_custom_attributes") from e
        return attributes.get(MODEL_ATTRIBUTE) or self.base_model
