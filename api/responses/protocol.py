"""OpenAI's Responses API on the wire: the request, its input items, the response and its output items, the
streamed events. Fields a request carries beyond these are refused by name or accepted as documented no-ops
(`api/responses/parameters.py`)."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from api.openai.protocol import MAX_INT32, MAX_TOOLS, JsonSchemaFormat

MAX_INPUT_ITEMS = 2048
MAX_METADATA_KEYS = 16


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Echoed(BaseModel):
    """An item a client sends back from an earlier response carries its `id` and `status`: accepted, they
    change nothing."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, max_length=256)
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class TextContent(BaseModel):
    """A text part: `input_text` in a user's message, `output_text` in an assistant's echoed back."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = Field(default=None, max_length=0)  # echoed output text has none
    logprobs: list[Any] | None = None  # echoed output text's; not rendered


def joined(content: str | list[TextContent]) -> str:
    """Text parts joined by newlines, as chat messages' parts are."""
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


class MessageItem(Echoed):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextContent]
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(Echoed):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    arguments: str


class FunctionCallOutputItem(Echoed):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[TextContent]


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    """A function tool, in the Responses API's flat shape (chat nests it under `function`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | FunctionToolChoice


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON that follows a schema (the schema's fields inline)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.schema_ is not None and self.name is not None):
            raise ValueError("name and schema are required with type json_schema, and only with it")
        return self

    def json_schema(self) -> JsonSchemaFormat | None:
        if self.type != "json_schema":
            return None
        return JsonSchemaFormat(name=self.name, description=self.description, schema=self.schema_,
                                strict=self.strict)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_INT32)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = Field(default=None, max_length=256)
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]],
                        Field(max_length=MAX_METADATA_KEYS)] | None = None
    store: bool = True
    previous_response_id: str | None = Field(default=None, max_length=256)
    stream: bool = False

    def items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: item_id("msg"))
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str = Field(default_factory=lambda: item_id("fc"))
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessage | OutputFunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    """A response as the API returns it, streams it in its events, and stores it."""

    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[FunctionTool] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def output_text(self) -> str:
        return "".join(part.text for item in self.output if isinstance(item, OutputMessage) for part in item.content)
