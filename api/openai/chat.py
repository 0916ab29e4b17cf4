"""POST /v1/chat/completions: messages through the chat template, deltas to chat chunks."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

from transformers import PreTrainedTokenizerBase

from api.errors import bad_request
from api.generation.accounting import RequestAccount
from api.generation.budget import output_budget
from api.generation.fanout import EngineCall, collect_choices, collected_deltas
from api.generation.resolve import ServedModel
from api.generation.sse import sse
from api.input_limits import check_request_size
from api.openai.chunks import ChatTextChunks
from api.openai.parameters import refuse_unsupported
from api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatTokenLogprob,
    DeltaMessage,
    FunctionCallDelta,
    ToolCallDelta,
    TopLogprob,
)
from api.openai.sampling import build_sampling_params
from api.openai.structured import checked_constraint, json_safe
from api.openai.tool_parser import StreamedReply, ToolCallParserName, parse_hermes
from api.openai.tools import (
    FunctionCall,
    NamedToolChoice,
    ToolCall,
    ToolChoice,
    finish_reason_of_calls,
    tool_calls_of,
    tool_schema,
)
from api.openai.usage import usage_of
from api.pipeline.request import GenerationService, Pipeline
from engine.types import ChoiceDelta, PositionLogprobs


def chat_logprobs(positions: tuple[PositionLogprobs, ...] | None) -> ChatLogprobs | None:
    if positions is None:
        return None

    def top(entry) -> TopLogprob:
        return TopLogprob(token=entry.token, logprob=entry.logprob, bytes=list(entry.token.encode()))

    return ChatLogprobs(content=[
        ChatTokenLogprob(**top(p.chosen).model_dump(), top_logprobs=[top(t) for t in p.top]) for p in positions
    ])


# apply_chat_template's own arguments: template variables may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """Variables the chat template sees beside the messages: `chat_template_kwargs` and `reasoning_effort`."""
    kwargs = dict(req.chat_template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if reserved:
        raise bad_request(f"chat_template_kwargs may not set {reserved}: they are the template call's own "
                          "arguments.", param="chat_template_kwargs")
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
    return kwargs


def template_messages(req: ChatCompletionRequest, has_developer_role: bool) -> list[dict[str, str]]:
    """The messages as the template takes them: `name` kept where given, `developer` as `system` for a template
    that does not know the role."""
    messages = []
    for m in req.messages:
        role = "system" if m.role == "developer" and not has_developer_role else m.role
        message: dict[str, Any] = {"role": role, "content": m.text()}
        if m.name is not None:
            message["name"] = m.name
        if m.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages


def assistant_reply(text: str, finish_reason: str | None,
                    forced: ToolChoice | None) -> tuple[AssistantMessage, str | None]:
    """The message and finish reason of a whole choice: its calls when a call was forced (text when cut short)."""
    calls = tool_calls_of(text, forced) if forced is not None else None
    if calls is None:
        return AssistantMessage(content=text), finish_reason
    return AssistantMessage(content=None, tool_calls=calls), finish_reason_of_calls(forced)


async def _whole_calls(req: ChatCompletionRequest, forced: ToolChoice,
                       deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChatChunkChoice]:
    """One chunk per choice, at its end: its calls (or its text, when cut short)."""
    async for d in collected_deltas(deltas):
        message, finish = assistant_reply(d.text, d.finish_reason, forced)
        calls = _call_deltas(message.tool_calls or [])
        yield ChatChunkChoice(index=d.index, delta=DeltaMessage(content=message.content, tool_calls=calls or None),
                              logprobs=chat_logprobs(d.logprobs), finish_reason=finish,
                              token_ids=list(d.token_ids) if req.return_token_ids else None)


def _call_deltas(calls: list[ToolCall]) -> list[ToolCallDelta]:
    return [ToolCallDelta(index=i, id=c.id, type="function",
                          function=FunctionCallDelta(name=c.function.name, arguments=c.function.arguments))
            for i, c in enumerate(calls)]


async def _auto_streamed(req: ChatCompletionRequest,
                         deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChatChunkChoice]:
    """`auto`: text as it comes until a call may be starting; the calls whole at the choice's end."""
    names = frozenset(t.function.name for t in req.tools or ())
    replies: dict[int, StreamedReply] = {}
    async for d in deltas:
        reply = replies.setdefault(d.index, StreamedReply(names))
        text, calls, finish = reply.feed(d.text), [], d.finish_reason
        if finish is not None:
            rest, calls = reply.finish()
            text += rest
            finish = "tool_calls" if calls else finish
        yield ChatChunkChoice(index=d.index, delta=DeltaMessage(content=text or None,
                                                                tool_calls=_call_deltas(calls) or None),
                              logprobs=chat_logprobs(d.logprobs), finish_reason=finish,
                              token_ids=list(d.token_ids) if req.return_token_ids else None)


def _text_choice(req: ChatCompletionRequest, d: ChoiceDelta) -> ChatChunkChoice:
    return ChatChunkChoice(index=d.index, delta=DeltaMessage(content=d.text) if d.text else DeltaMessage(),
                           logprobs=chat_logprobs(d.logprobs), finish_reason=d.finish_reason,
                           token_ids=list(d.token_ids) if req.return_token_ids else None)


async def _text_choices(req: ChatCompletionRequest,
                        deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChatChunkChoice]:
    async for d in deltas:
        yield _text_choice(req, d)


async def _streamed_call(req: ChatCompletionRequest, forced: NamedToolChoice,
                         deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChatChunkChoice]:
    """A chunk per delta: the forced function's arguments as they are generated (a choice's first call delta
    carries the call's id and name, as the openai SDK accumulates them)."""
    call_ids: dict[int, str] = {}
    async for d in deltas:
        if not d.text:
            yield _text_choice(req, d)
            continue
        head = d.index not in call_ids
        if head:
            call_ids[d.index] = ToolCall(function=FunctionCall(name=forced.function.name, arguments="")).id
        delta = DeltaMessage(tool_calls=[ToolCallDelta(
            index=0, id=call_ids[d.index] if head else None, type="function" if head else None,
            function=FunctionCallDelta(name=forced.function.name if head else None, arguments=d.text))])
        yield ChatChunkChoice(index=d.index, delta=delta, logprobs=chat_logprobs(d.logprobs),
                              finish_reason=d.finish_reason,
                              token_ids=list(d.token_ids) if req.return_token_ids else None)


def auto_reply(text: str, finish_reason: str | None, req: ChatCompletionRequest) -> tuple[AssistantMessage, str | None]:
    """`auto`: the calls the parser finds in the text (finish reason `tool_calls`), else the text."""
    parsed = parse_hermes(text, frozenset(t.function.name for t in req.tools or ()))
    if not parsed.calls:
        return AssistantMessage(content=text), finish_reason
    return AssistantMessage(content=parsed.content, tool_calls=parsed.calls), "tool_calls"


class ChatService(GenerationService[ChatCompletionRequest]):
    """`chat_template` replaces the model's own (None: the model's); `tool_call_parser` None refuses `auto`."""

    response_prefix = "chatcmpl"

    def __init__(self, pipeline: Pipeline, chat_template: str | None = None,
                 tool_call_parser: ToolCallParserName | None = None):
        super().__init__(pipeline)
        self.chat_template = chat_template
        self.tool_call_parser = tool_call_parser

    def parses_calls(self, req: ChatCompletionRequest) -> bool:
        """`auto` with tools: the reply is text or calls, as the parser finds them."""
        return self.tool_call_parser is not None and bool(req.tools) and req.tool_choice in (None, "auto")

    def reply(self, req: ChatCompletionRequest, text: str,
              finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
        """The message and finish reason of a whole choice."""
        if self.parses_calls(req):
            return auto_reply(text, finish_reason, req)
        return assistant_reply(text, finish_reason, req.forced_tool_choice())

    def choice_stream(self, req: ChatCompletionRequest,
                      deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChatChunkChoice]:
        """The chunks' choices after the first (the role) chunk."""
        calls = self.call_stream(req, deltas)
        return calls if calls is not None else _text_choices(req, deltas)

    def call_stream(self, req: ChatCompletionRequest,
                    deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChatChunkChoice] | None:
        """The chunks' choices after the first (the role) chunk where calls may be streamed; None for text only."""
        forced = req.forced_tool_choice()
        if self.parses_calls(req):
            return _auto_streamed(req, deltas)
        if forced is None:
            return None
        if not isinstance(forced, NamedToolChoice):
            return _whole_calls(req, forced, deltas)  # `required`: calls are known once their JSON is whole
        return _streamed_call(req, forced, deltas)

    def render_prompt(self, req: ChatCompletionRequest, add_generation_prompt: bool = True) -> list[int]:
        tokenizer = self.engine.tokenizer()
        template = self.chat_template or tokenizer.chat_template
        template = template if isinstance(template, str) else ""
        messages = template_messages(req, has_developer_role="developer" in template)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        try:
            text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=template or None,
                                                 add_generation_prompt=add_generation_prompt, **template_kwargs(req))
        except Exception as e:  # jinja errors from the model's own template
            raise bad_request(f"The chat template could not render these messages: {e}", param="messages") from e
        return tokenizer.encode(text, add_special_tokens=False)

    async def prepare(self, req: ChatCompletionRequest, response_id: str, tenant_cap: int | None) -> list[EngineCall]:
        check_request_size(self.pipeline.input_limits, prompts=1, n=req.n, stop=req.stop, messages=len(req.messages))
        refuse_unsupported(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
        template_kwargs(req)  # refused before the template runs
        # `auto` without a parser, and unknown names, refused
        tool_schema(req.tools, req.tool_choice, req.parallel_tool_calls, auto_parser=self.tool_call_parser is not None)
        structured = await checked_constraint(req)
        prompt = await self.tokenize(lambda: self.render_prompt(req), sum(len(m.text()) for m in req.messages))
        max_tokens = output_budget(len(prompt), req.output_limit(), tenant_cap, self.engine.max_model_len, "messages")
        num_logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = build_sampling_params(req, max_tokens, num_logprobs, len(self.engine.tokenizer()), structured)
        return [EngineCall(request_id=response_id, prompt_token_ids=prompt, params=params)]

    async def stream_events(self, req: ChatCompletionRequest, served: ServedModel, response_id: str, created: int,
                            calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                            account: RequestAccount) -> AsyncIterator[str]:
        deltas = json_safe(req, deltas)
        model = served.id

        def chunk(choices, usage=None) -> str:
            return sse(ChatCompletionChunk(id=response_id, created=created, model=model, choices=choices, usage=usage))

        yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                     for i in range(req.n)])
        call_choices = self.call_stream(req, deltas)
        if call_choices is not None:
            async for choice in call_choices:
                yield chunk([choice])
        else:
            text_chunks = ChatTextChunks(response_id, created, model)
            async for d in deltas:
                if d.logprobs is None:
                    yield text_chunks.line(d.index, d.text or None, d.finish_reason,
                                           d.token_ids if req.return_token_ids else None)
                else:
                    yield chunk([_text_choice(req, d)])
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunk([], usage=usage_of(account))

    async def collect(self, req: ChatCompletionRequest, served: ServedModel, response_id: str, created: int,
                      calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                      account: RequestAccount) -> ChatCompletionResponse:
        deltas = json_safe(req, deltas)
        collected = await collect_choices(deltas, req.n)
        replies = [self.reply(req, c.text, c.finish_reason) for c in collected]
        choices = [
            ChatChoice(
                index=i,
                message=message,
                logprobs=chat_logprobs(tuple(c.logprobs)) if req.logprobs else None,
                finish_reason=finish,
                token_ids=c.token_ids if req.return_token_ids else None,
            )
            for i, (c, (message, finish)) in enumerate(zip(collected, replies))
        ]
        return ChatCompletionResponse(
            id=response_id, created=created, model=served.id, choices=choices,
            usage=usage_of(account),
            prompt_token_ids=calls[0].prompt_token_ids if req.return_token_ids else None,
        )
