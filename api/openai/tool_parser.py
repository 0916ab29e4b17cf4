"""`tool_choice` `auto`: the model decides, and a parser finds its calls in the text it wrote. Pure.

The `hermes` format (Hermes, Qwen, the SmolLM2 demo's tool template): each call is a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`; text before the first call is the
message's content. A block that is not such an object (or not closed) stays text: a call is returned only when it
parses and names one of the request's tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from api.openai.tools import FunctionCall, ToolCall

ToolCallParserName = Literal["hermes"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    calls: list[ToolCall]


def _call_of(block: str, names: frozenset[str]) -> ToolCall | None:
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(function=FunctionCall(name=value["name"], arguments=json.dumps(arguments)))


def parse_hermes(text: str, names: frozenset[str]) -> ParsedReply:
    """The content before the first `<tool_call>` and the calls after it; the whole text as content when any
    block is not a call to one of `names`."""
    head, found, rest = text.partition(OPEN)
    if not found:
        return ParsedReply(text, [])
    calls = []
    blocks = (OPEN + rest).split(OPEN)[1:]
    for block in blocks:
        body, closed, tail = block.partition(CLOSE)
        call = _call_of(body, names) if closed else None
        if call is None or tail.strip():  # only whitespace between and after calls
            return ParsedReply(text, [])
        calls.append(call)
    content = head.strip()
    return ParsedReply(content or None, calls)


@dataclass
class StreamedReply:
    """The text of a streamed reply, let out as it comes until a `<tool_call>` may be starting; from there it is
    held, and parsed when the reply ends. `feed` returns the text safe to send now."""

    names: frozenset[str]
    sent: str = ""
    held: str = ""
    holding_calls: bool = field(default=False)

    def feed(self, piece: str) -> str:
        if self.holding_calls:
            self.held += piece
            return ""
        pending = self.held + piece
        at = pending.find(OPEN)
        if at >= 0:
            self.holding_calls = True
            self.held = pending[at:]
            return self._send(pending[:at])
        keep = _partial_open(pending)  # a tail that may be the start of `<tool_call>`
        self.held = pending[len(pending) - keep:] if keep else ""
        return self._send(pending[:len(pending) - keep])

    def _send(self, text: str) -> str:
        self.sent += text
        return text

    def finish(self) -> tuple[str, list[ToolCall]]:
        """Text still to send and the calls, at the end of the reply. Held text that is not a run of calls goes
        out as text."""
        if not self.holding_calls:
            return self._send(self.held), []
        parsed = parse_hermes(self.sent + self.held, self.names)
        if not parsed.calls:
            return self._send(self.held), []
        return "", parsed.calls


def _partial_open(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `<tool_call>`."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0
