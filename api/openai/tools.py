"""Tool calling by constrained decoding: `tool_choice` `required` or a named function makes the engine generate
JSON that matches the tools' schemas (as vLLM's server does), so any model returns a valid call. `auto` needs a
model-specific tool-call parser (`api/openai/tool_parser.py`, chosen by `--tool-call-parser`) and is refused by
name without one; `none` generates text. Pure."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.errors import bad_request


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    type: Literal["function"] = "function"
    function: FunctionCall


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def forced_tool(tools: list[ToolDefinition] | None, choice: ToolChoice | None) -> ToolDefinition | None:
    """The named function `choice` forces, or None; a 400 when it is not among `tools`."""
    if not isinstance(choice, NamedToolChoice):
        return None
    for tool in tools or ():
        if tool.function.name == choice.function.name:
            return tool
    raise bad_request(f"tool_choice names {choice.function.name!r}, which is not among the tools.",
                      param="tool_choice.function.name")


def tool_schema(tools: list[ToolDefinition] | None, choice: ToolChoice | None,
                parallel_tool_calls: bool | None, auto_parser: bool = False) -> dict[str, Any] | None:
    """The JSON schema the output must follow: a named function's parameters, or for `required` an array of
    {name, parameters} objects (one at most when `parallel_tool_calls` is false); None when no call is forced.
    `auto` (the default with tools) is refused unless the server has a tool-call parser (`auto_parser`)."""
    if choice is not None and not tools:
        raise bad_request("tool_choice needs tools.", param="tool_choice")
    if tools and choice in (None, "auto"):
        if not auto_parser:
            raise _auto_refused()
        return None
    if not tools or choice == "none":
        return None
    forced = forced_tool(tools, choice)
    if forced is not None:
        return _parameters(forced)
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
         "properties": {"name": {"enum": [t.function.name]}, "parameters": _parameters(t)}} for t in tools]}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


def _auto_refused():
    return bad_request("tool_choice 'auto' (the default when tools are given) needs a tool-call parser for the "
                       "model, which this server was not started with (--tool-call-parser); send tool_choice "
                       "'required', a named function, or 'none'.", param="tool_choice", code="unsupported_parameter")


def tool_calls_of(text: str, choice: ToolChoice) -> list[ToolCall] | None:
    """The calls in a constrained output; None when it is not whole JSON (cut by `max_tokens`)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(choice, NamedToolChoice):  # the arguments as generated, as a stream sends them
        return [ToolCall(function=FunctionCall(name=choice.function.name, arguments=text))]
    return [ToolCall(function=FunctionCall(name=item["name"], arguments=json.dumps(item["parameters"])))
            for item in value]


def finish_reason_of_calls(choice: ToolChoice) -> str:
    """OpenAI's: `tool_calls` when the model was required to call, `stop` when a named function was forced."""
    return "stop" if isinstance(choice, NamedToolChoice) else "tool_calls"
