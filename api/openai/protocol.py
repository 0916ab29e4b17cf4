"""OpenAI wire format: request and response models. Ranges that OpenAI documents are enforced here."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.generation.budget import OutputLimit
from api.openai.tools import ToolCall, ToolChoice, ToolDefinition

MAX_N = 16
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
# Token counts beyond this overflow the engine's 32-bit integers; no context is that long.
MAX_INT32 = 2**31 - 1
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_CHOICES = 256
MAX_TOOLS = 128
# A schema, regex or grammar is compiled in the serving process before the request reaches the engine.
MAX_CONSTRAINT_CHARS = 64 * 1024
Constraint = Annotated[str, Field(max_length=MAX_CONSTRAINT_CHARS)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON that follows a schema."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only with it")
        return self


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` extension: exactly one constraint on the output."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | Constraint | None = Field(default=None, alias="json")
    regex: Constraint | None = None
    choice: Annotated[list[Constraint], Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    grammar: Constraint | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, "json_" if name == "json" else name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"exactly one of json, regex, choice, grammar, json_object is required, got "
                             f"{given or 'none'}")
        return self


class SamplingFields(BaseModel):
    """Fields shared by chat and completions, including vLLM's extensions its benchmark client sends.

    Fields a body carries beyond these are refused by name or accepted as documented no-ops
    (`api/openai/parameters.py`); none is silently ignored."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    user: str | None = Field(default=None, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM extensions
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=MAX_INT32)
    top_k: int | None = Field(default=None, ge=-1, le=MAX_INT32)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=MAX_INT32)]],
                              Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    return_token_ids: bool = Field(default=False, description="Also return prompt and output token ids.")

    @model_validator(mode="after")
    def _check(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.structured_outputs is not None and self.response_format not in (None, ResponseFormat(type="text")):
            raise ValueError("response_format and structured_outputs each constrain the output; send one")
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # A message echoed back from a response carries its null fields (`refusal`, `annotations`, ...); a field
    # set to anything else is refused by name (`api/openai/parameters.py`).
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = Field(default=None, max_length=256)  # a tool's answer to that call

    @model_validator(mode="after")
    def _tool_fields_by_role(self):
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool_call_id is required on a tool message, and only there")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages")
        return self

    def text(self) -> str:
        """The message's text; parts joined by newlines, as vLLM's server joins them."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    modalities: list[Literal["text"]] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def forced_tool_choice(self) -> ToolChoice | None:
        """`required` or a named function when tools are given: the output is then a call."""
        if self.tools and (self.tool_choice == "required" or isinstance(self.tool_choice, BaseModel)):
            return self.tool_choice
        return None

    def output_limit(self) -> OutputLimit:
        if self.max_completion_tokens is not None:
            return OutputLimit(self.max_completion_tokens, "max_completion_tokens")
        return OutputLimit(self.max_tokens, "max_tokens")


Prompt = str | list[str] | list[int] | list[list[int]]


# OpenAI's (and vLLM's) default output length on /v1/completions.
COMPLETION_DEFAULT_MAX_TOKENS = 16


class CompletionRequest(SamplingFields):
    prompt: Prompt
    # 0 only with `echo`: the prompt's log-probabilities and nothing generated (how evaluation harnesses score).
    max_tokens: int | None = Field(default=COMPLETION_DEFAULT_MAX_TOKENS, ge=0, le=MAX_INT32)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)

    @model_validator(mode="after")
    def _check_prompt(self):
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("prompt must not be empty")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of must equal n ({self.n}): the server returns every sequence it generates")
        return self

    def output_limit(self) -> OutputLimit:
        return OutputLimit(self.max_tokens, "max_tokens")


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens found in the engine's prefix cache (this tenant's own).")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionLogprobs(BaseModel):
    """With `echo`, the prompt's positions come first; the first has no log-probability (null)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    token_ids: list[int] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = Field(default=None, exclude_if=lambda v: v is None)


class FunctionCallDelta(BaseModel):
    name: str | None = Field(default=None, exclude_if=lambda v: v is None)
    arguments: str


class ToolCallDelta(BaseModel):
    """What the openai SDK accumulates by `index`: the first delta of a call names it, later ones add arguments."""

    index: int
    id: str | None = Field(default=None, exclude_if=lambda v: v is None)
    type: Literal["function"] | None = Field(default=None, exclude_if=lambda v: v is None)
    function: FunctionCallDelta


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, exclude_if=lambda v: v is None)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[list[int]] | None = Field(default=None, exclude_if=lambda v: v is None)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "loraplex"
    root: str
    parent: str | None = None
    # loraplex extensions on adapter cards: every published version, and where each alias points.
    versions: list[int] | None = None
    aliases: dict[str, int] | None = None
    # loraplex extensions on virtual model cards (api/graphs): cascade or ensemble, and the models it runs.
    kind: str | None = None
    members: list[str] | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
