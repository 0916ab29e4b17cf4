"""POST /v1/responses over the chat path: a turn becomes a chat request (instructions, the stored conversation of
`previous_response_id`, the input items), runs through the same pipeline (resolution, limits, admission, adapter,
billing), and its reply becomes output items; streamed as the typed events the SDK parses. Stored per tenant."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from api.auth import Caller
from api.errors import OpenAIError, bad_request
from api.generation.accounting import RequestAccount
from api.generation.budget import OutputLimit
from api.generation.fanout import EngineCall
from api.generation.resolve import ServedModel
from api.openai.chat import ChatService
from api.openai.parameters import refuse_unsupported
from api.openai.protocol import ChatCompletionRequest, ChatCompletionResponse, DeltaMessage, Usage
from api.openai.structured import json_safe
from api.openai.usage import usage_of
from api.pipeline.request import GenerationService
from api.responses.parameters import RESPONSES
from api.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    joined,
)
from api.responses.store import ResponseStore
from engine.types import ChoiceDelta


def response_not_found(response_id: str, param: str) -> OpenAIError:
    return OpenAIError(404, f"No response {response_id!r} is stored for this tenant.", param=param,
                       code="response_not_found")


@dataclass
class ResponseTurn:
    """One `/v1/responses` request made ready for the pipeline: the chat request it runs as, the tenant it is
    stored for, and the conversation it continues."""

    request: ResponsesRequest
    chat: ChatCompletionRequest
    tenant: str
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def user(self) -> str | None:
        return self.request.user

    def output_limit(self) -> OutputLimit:
        return OutputLimit(self.request.max_output_tokens, "max_output_tokens")


def input_messages(items: list[MessageItem | FunctionCallItem | FunctionCallOutputItem]) -> list[dict[str, Any]]:
    """Input items as chat messages; consecutive function calls are one assistant message's calls."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": joined(item.content)})
        elif isinstance(item, FunctionCallItem):
            _add_call(messages, item.call_id, item.name, item.arguments)
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": joined(item.output)})
    return messages


def _add_call(messages: list[dict[str, Any]], call_id: str, name: str, arguments: str) -> None:
    """A call joins the assistant message just before it (text or calls), else opens one."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request a turn runs as."""
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    fmt = req.text.format if req.text is not None else None
    body: dict[str, Any] = {
        "model": req.model, "messages": instructions + history + input_messages(req.items()),
        "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
        "user": req.user, "stream": req.stream, "parallel_tool_calls": req.parallel_tool_calls,
    }
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
    if req.tool_choice is not None:
        choice = req.tool_choice
        body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                        "function": {"name": choice.name}}
    if fmt is not None:
        body["response_format"] = {"type": fmt.type, "json_schema": fmt.json_schema()}
    return ChatCompletionRequest.model_validate(body)


def output_messages(output: list[OutputItem]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a next turn continues from."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if isinstance(item, OutputMessage):
            messages.append({"role": "assistant", "content": "".join(p.text for p in item.content)})
        else:
            _add_call(messages, item.call_id, item.name, item.arguments)
    return messages


def response_usage(usage: Usage) -> ResponseUsage:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ResponseUsage(input_tokens=usage.prompt_tokens, input_tokens_details=InputTokensDetails(cached_tokens=cached),
                         output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens)


def response_of(turn: ResponseTurn, response_id: str, created: int, model: str, status: str,
                output: list[OutputItem] | None = None, usage: Usage | None = None) -> ResponseObject:
    req = turn.request
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    return ResponseObject(
        id=response_id, created_at=created, status=status, model=model, output=output or [],
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens,
        parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
        store=req.store, temperature=req.temperature, top_p=req.top_p, user=req.user,
        text={"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        tool_choice=(req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump")
                     else req.tool_choice or "auto"),
        tools=req.tools or [], metadata=req.metadata or {},
        usage=response_usage(usage) if usage is not None else None,
    )


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


class ResponsesService(GenerationService[ResponseTurn]):
    response_prefix = "resp"

    def __init__(self, chat: ChatService, store: ResponseStore):
        super().__init__(chat.pipeline)
        self.chat = chat
        self.store = store

    async def turn(self, req: ResponsesRequest, caller: Caller) -> ResponseTurn:
        """The request as a turn: unsupported fields refused, the previous response found (this tenant's only)."""
        refuse_unsupported(req, RESPONSES)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            stored = await asyncio.to_thread(self.store.get, caller.tenant, req.previous_response_id)
            if stored is None:
                raise response_not_found(req.previous_response_id, "previous_response_id")
            history = stored.conversation
        try:
            chat = chat_request(req, history)
        except ValueError as e:
            raise bad_request(f"The input cannot be rendered as a conversation: {e}", param="input") from e
        return ResponseTurn(req, chat, caller.tenant, history)

    async def prepare(self, turn: ResponseTurn, response_id: str, tenant_cap: int | None) -> list[EngineCall]:
        return await self.chat.prepare(turn.chat, response_id, tenant_cap)

    async def _keep(self, turn: ResponseTurn, response: ResponseObject) -> None:
        if turn.request.store:
            conversation = [*turn.history, *input_messages(turn.request.items()), *output_messages(response.output)]
            await asyncio.to_thread(self.store.put, turn.tenant, response.model_dump(mode="json"), conversation)

    async def collect(self, turn: ResponseTurn, served: ServedModel, response_id: str, created: int,
                      calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                      account: RequestAccount) -> ResponseObject:
        chat: ChatCompletionResponse = await self.chat.collect(turn.chat, served, response_id, created, calls, deltas,
                                                               account)
        choice = chat.choices[0]
        output: list[OutputItem] = []
        message = choice.message
        if message.content or not message.tool_calls:
            output.append(OutputMessage(content=[OutputText(text=message.content or "")]))
        output += [OutputFunctionCall(call_id=c.id, name=c.function.name, arguments=c.function.arguments)
                   for c in message.tool_calls or ()]
        response = response_of(turn, response_id, created, served.id, status_of(choice.finish_reason), output,
                               chat.usage)
        await self._keep(turn, response)
        return response

    async def stream_events(self, turn: ResponseTurn, served: ServedModel, response_id: str, created: int,
                            calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                            account: RequestAccount) -> AsyncIterator[str]:
        events = OutputEvents()
        started = response_of(turn, response_id, created, served.id, "in_progress")
        yield events.emit("response.created", response=started)
        yield events.emit("response.in_progress", response=started)
        finish = None
        async for choice in self.chat.choice_stream(turn.chat, json_safe(turn.chat, deltas)):
            for line in events.choice(choice.delta):
                yield line
            finish = choice.finish_reason or finish
        if not events.output:  # nothing generated: one empty message, as a collected response has
            for line in events.empty_message():
                yield line
        for line in events.close():
            yield line
        status = status_of(finish)
        response = response_of(turn, response_id, created, served.id, status, events.output, usage_of(account))
        await self._keep(turn, response)
        yield events.emit(f"response.{status}", response=response)


class OutputEvents:
    """The output items of a streamed reply as events: a message item while text comes, a function call item per
    call; each item is closed (its `done` events) before the next opens."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[OutputItem] = []
        self._open: OutputItem | None = None

    def emit(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence,
                   **{k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in fields.items()}}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def choice(self, delta: DeltaMessage) -> list[str]:
        lines = []
        if delta.content:
            if not isinstance(self._open, OutputMessage):
                lines += self.close()
                lines += self._add(OutputMessage(status="in_progress"))
                lines.append(self.emit("response.content_part.added", item_id=self._open.id,
                                       output_index=self._index, content_index=0, part=OutputText(text="")))
                self._open.content.append(OutputText(text=""))
            self._open.content[0].text += delta.content
            lines.append(self.emit("response.output_text.delta", item_id=self._open.id, output_index=self._index,
                                   content_index=0, delta=delta.content, logprobs=[]))
        for call in delta.tool_calls or ():
            if call.id is not None:  # a call's first delta
                lines += self.close()
                lines += self._add(OutputFunctionCall(call_id=call.id, name=call.function.name or "", arguments="",
                                                      status="in_progress"))
            if call.function.arguments and isinstance(self._open, OutputFunctionCall):
                self._open.arguments += call.function.arguments
                lines.append(self.emit("response.function_call_arguments.delta", item_id=self._open.id,
                                       output_index=self._index, delta=call.function.arguments))
        return lines

    def empty_message(self) -> list[str]:
        lines = self._add(OutputMessage(status="in_progress", content=[OutputText(text="")]))
        lines.append(self.emit("response.content_part.added", item_id=self._open.id, output_index=self._index,
                               content_index=0, part=OutputText(text="")))
        return lines

    @property
    def _index(self) -> int:
        return len(self.output) - 1

    def _add(self, item: OutputItem) -> list[str]:
        self.output.append(item)
        self._open = item
        return [self.emit("response.output_item.added", output_index=self._index, item=item)]

    def close(self) -> list[str]:
        """The `done` events of the open item, if any."""
        item, lines = self._open, []
        if item is None:
            return lines
        self._open = None
        if isinstance(item, OutputMessage):
            part = item.content[0]
            lines.append(self.emit("response.output_text.done", item_id=item.id, output_index=self._index,
                                   content_index=0, text=part.text, logprobs=[]))
            lines.append(self.emit("response.content_part.done", item_id=item.id, output_index=self._index,
                                   content_index=0, part=part))
        else:
            lines.append(self.emit("response.function_call_arguments.done", item_id=item.id,
                                   output_index=self._index, name=item.name, arguments=item.arguments))
        item.status = "completed"
        lines.append(self.emit("response.output_item.done", output_index=self._index, item=item))
        return lines
