"""The per-stream chunk formats write the bytes the protocol models write."""

import json

import pytest

from api.generation.sse import sse
from api.openai.chunks import ChatTextChunks, CompletionTextChunks
from api.openai.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionResponse,
    DeltaMessage,
)

TEXTS = ["", "Hello", ' "quoted" \\ back', "\n\t\r\b\f", "\x00\x01\x1f\x7f", "é漢字😀", "\u2028\u2029", "</script>",
         "choices\":[]", "\ufffd"]
MODELS = ["tiny-llama", "poet@1", 'we"ird\\"choices":[]', "mix(a@1=0.7+b@2=0.3)"]
ENDINGS = [(None, None), ("stop", None), ("length", (1, 2, 30000)), (None, ()), ("abort", (7,))]
# Each text, each model and each ending at least once.
CASES = ([(text, MODELS[0], *ENDINGS[0]) for text in TEXTS] + [("Hello", model, *ENDINGS[0]) for model in MODELS[1:]]
         + [("Hello", MODELS[1], *ending) for ending in ENDINGS[1:]])


@pytest.mark.parametrize(("text", "model", "finish_reason", "token_ids"), CASES)
def test_completion_text_chunk_equals_the_models_json(text, model, finish_reason, token_ids):
    expected = sse(CompletionResponse(id="cmpl-1", created=1700000000, model=model, choices=[CompletionChoice(
        index=3, text=text, finish_reason=finish_reason, token_ids=None if token_ids is None else list(token_ids))]))
    line = CompletionTextChunks("cmpl-1", 1700000000, model).line(3, text, finish_reason, token_ids)
    assert line == expected
    assert json.loads(line.removeprefix("data: "))["choices"][0]["text"] == text


@pytest.mark.parametrize(("content", "model", "finish_reason", "token_ids"),
                         [(text or None, model, finish, ids) for text, model, finish, ids in CASES])
def test_chat_text_chunk_equals_the_models_json(content, model, finish_reason, token_ids):
    expected = sse(ChatCompletionChunk(id="chatcmpl-1", created=1700000000, model=model, choices=[ChatChunkChoice(
        index=0, delta=DeltaMessage(content=content), finish_reason=finish_reason,
        token_ids=None if token_ids is None else list(token_ids))]))
    line = ChatTextChunks("chatcmpl-1", 1700000000, model).line(0, content, finish_reason, token_ids)
    assert line == expected
