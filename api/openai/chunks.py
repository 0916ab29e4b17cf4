"""Text chunks of a stream as SSE lines, without a protocol model per token.

A streamed response repeats its id, created time and model in every chunk; in the common case (text only: no
log-probabilities, no tool calls) the rest is an index, a piece of text and a finish reason. The fixed part is
rendered once per stream by the protocol models themselves, and each chunk is formatted into it. The bytes are the
models' `model_dump_json` output (tests/api/openai/test_chunks.py compares them), at a fraction of the CPU: on 2
cores, the API process's CPU per token is taken from the engine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel

from api.openai.protocol import ChatCompletionChunk, CompletionResponse

_CHOICES = '"choices":[]'


def _frame(empty: BaseModel) -> tuple[str, str]:
    """`data: {...,"choices":[` and `],...}` of a chunk without choices. The marker cannot occur inside a JSON
    string (every quote there is escaped), so the first match is the field."""
    body = empty.model_dump_json()
    at = body.index(_CHOICES) + len(_CHOICES) - 1
    return f"data: {body[:at]}", f"{body[at:]}\n\n"


def _tail(finish_reason: str | None, token_ids: Sequence[int] | None) -> str:
    finish = "null" if finish_reason is None else json.dumps(finish_reason)
    ids = "" if token_ids is None else f',"token_ids":[{",".join(map(str, token_ids))}]'
    return f'"finish_reason":{finish}{ids}}}'


class CompletionTextChunks:
    """`CompletionResponse` chunks of one stream holding one `CompletionChoice` without logprobs."""

    def __init__(self, response_id: str, created: int, model: str):
        self._head, self._end = _frame(CompletionResponse(id=response_id, created=created, model=model, choices=[]))

    def line(self, index: int, text: str, finish_reason: str | None, token_ids: Sequence[int] | None) -> str:
        text_json = json.dumps(text, ensure_ascii=False)
        return (f'{self._head}{{"index":{index},"text":{text_json},"logprobs":null,'
                f'{_tail(finish_reason, token_ids)}{self._end}')


class ChatTextChunks:
    """`ChatCompletionChunk` chunks of one stream holding one `ChatChunkChoice` whose delta is content only (None:
    an empty delta) and which has no logprobs."""

    def __init__(self, response_id: str, created: int, model: str):
        self._head, self._end = _frame(ChatCompletionChunk(id=response_id, created=created, model=model, choices=[]))

    def line(self, index: int, content: str | None, finish_reason: str | None,
             token_ids: Sequence[int] | None) -> str:
        content_json = "null" if content is None else json.dumps(content, ensure_ascii=False)
        return (f'{self._head}{{"index":{index},"delta":{{"role":null,"content":{content_json}}},"logprobs":null,'
                f'{_tail(finish_reason, token_ids)}{self._end}')
