"""Every OpenAI request parameter and what loraplex does with it. Pure.

A parameter is honoured (a field of the protocol models, `HONOURED` says how), accepted as a no-op for a stated
reason (`NO_OPS`), or refused with a 400 `unsupported_parameter` that names it (`REFUSED`, and any field this
module does not know). A refused parameter sent as `null`, or with the value that asks for nothing
(`ASKS_NOTHING`), is accepted: it requests nothing the server does not do. `python -m api.openai.parameters`
prints the table that docs/parameters.md holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from api.errors import bad_request

HONOURED: dict[str, str] = {
    "model": "the base model, an adapter (`name`, `name@version`, `name@alias`) or a virtual model",
    "messages": "chat: rendered with the model's chat template; `name` kept, text parts joined by newlines",
    "prompt": "completions: text, a list of texts, token ids or lists of token ids",
    "max_tokens": "output cap (completions default 16, as OpenAI's; chat: the rest of the context), bounded by "
                  "the tenant's cap",
    "max_completion_tokens": "chat: output cap, preferred over `max_tokens`",
    "temperature": "sampling temperature; 0 is greedy",
    "top_p": "nucleus sampling",
    "seed": "per-request seed",
    "stop": "up to 4 stop strings",
    "n": "choices per prompt (up to 16)",
    "best_of": "completions: must equal `n` (every generated sequence is returned)",
    "echo": "completions: the prompt before the output; with `logprobs`, the prompt's log-probabilities first "
            "(the first position's null); `max_tokens` 0 then returns the prompt alone",
    "presence_penalty": "as OpenAI's",
    "frequency_penalty": "as OpenAI's",
    "logit_bias": "token id (as a string) to a bias in [-100, 100] added to its logit",
    "logprobs": "chat: a boolean; completions: how many alternatives per position (up to 5)",
    "top_logprobs": "chat: alternatives per position (up to 20), with `logprobs: true`",
    "response_format": "`text`; `json_object` or `json_schema` (with `strict`) constrain decoding to valid JSON "
                       "(compact: no whitespace between tokens)",
    "user": "end-user id: keeps a user on one rollout arm",
    "tools": "chat: function tools, passed to the chat template; with `tool_choice` `required` or a named "
             "function the output is a call matching their schemas (constrained decoding)",
    "tool_choice": "chat: `none`, `required` or a named function; `auto` (the default with tools) with a "
                   "server started with `--tool-call-parser` (the SmolLM2 demo is), else refused",
    "parallel_tool_calls": "chat: `false` allows one call at most under `required`",
    "stream": "server-sent events",
    "stream_options": "`include_usage` adds a final usage chunk",
    "modalities": "chat: `[\"text\"]` only",
    "reasoning_effort": "chat: passed to the chat template as `reasoning_effort`",
    "chat_template_kwargs": "chat (vLLM): extra variables for the chat template",
    "structured_outputs": "vLLM: exactly one of `json` (a schema), `regex`, `choice`, `grammar` (EBNF or Lark), "
                          "`json_object`",
    "ignore_eos": "vLLM: keep generating past the end-of-sequence token",
    "min_tokens": "vLLM: no stop before this many tokens",
    "top_k": "vLLM: top-k sampling",
    "min_p": "vLLM: min-p sampling",
    "repetition_penalty": "vLLM: repetition penalty",
    "stop_token_ids": "vLLM: token ids that end the output (up to 64)",
    "return_token_ids": "vLLM: add `prompt_token_ids` and each choice's `token_ids`",
}

NO_OPS: dict[str, str] = {
    "metadata": "tags for OpenAI's stored completions; nothing is stored, and the ledger keys usage by request id",
    "service_tier": "one tier serves every request; priority comes from the tenant's class",
    "prompt_cache_key": "a routing hint for OpenAI's caches; the prefix cache here is automatic, per tenant",
    "safety_identifier": "an abuse-monitoring id for OpenAI; usage is recorded per tenant and `user`",
}

REFUSED: dict[str, str] = {
    "functions": "the form of function calling before tools is not available; send tools",
    "function_call": "the form of function calling before tools is not available; send tool_choice",
    "audio": "audio output is not available; the server generates text",
    "prediction": "predicted outputs are not available",
    "web_search_options": "web search is not available",
    "store": "stored completions are not kept",
    "moderation": "moderation is not available",
    "verbosity": "no template here reads a verbosity setting",
    "prompt_cache_options": "the prefix cache is automatic; it has no options",
    "prompt_cache_retention": "the prefix cache keeps blocks while memory allows; no retention is promised",
    "suffix": "no model served here has a fill-in-the-middle template",
}

ASKS_NOTHING: dict[str, Any] = {"store": False}

# A chat message's fields beyond role, content, name, tool_calls and tool_call_id (a message echoed from a response carries them as null).
MESSAGE_REFUSED: dict[str, str] = {
    "function_call": "function calling (the form before tools) is not available; send tool_calls",
    "audio": "audio is not available",
    "refusal": "refusals are not rendered into prompts",
}
MESSAGE_ASKS_NOTHING: dict[str, Any] = {"annotations": []}


@dataclass(frozen=True)
class ParameterTable:
    """One endpoint family's parameters: honoured (how), no-ops (why), refused (why), and the values of refused
    ones that ask for nothing."""

    honoured: dict[str, str]
    no_ops: dict[str, str]
    refused: dict[str, str]
    asks_nothing: dict[str, Any]


CHAT_AND_COMPLETIONS = ParameterTable(HONOURED, NO_OPS, REFUSED, ASKS_NOTHING)


def _asks_something(name: str, value: Any, nothing: dict[str, Any]) -> bool:
    return value is not None and not (name in nothing and value == nothing[name])


def unsupported_fields(req: BaseModel, table: ParameterTable = CHAT_AND_COMPLETIONS) -> list[str]:
    """Fields of `req` (and of its chat messages) beyond its model that are neither no-ops, nor `null`, nor
    asking for nothing; a message's as `messages[i].field`."""
    names = sorted(name for name, value in (req.model_extra or {}).items()
                   if name not in table.no_ops and _asks_something(name, value, table.asks_nothing))
    for i, message in enumerate(getattr(req, "messages", None) or ()):
        names += [f"messages[{i}].{name}" for name, value in sorted((message.model_extra or {}).items())
                  if _asks_something(name, value, MESSAGE_ASKS_NOTHING)]
    return names


def _reason(name: str, table: ParameterTable) -> str:
    if name.startswith("messages["):
        return MESSAGE_REFUSED.get(name.split(".", 1)[1], "not a field of a chat message")
    return table.refused.get(name, "not a parameter of this endpoint")


def refuse_unsupported(req: BaseModel, table: ParameterTable = CHAT_AND_COMPLETIONS) -> None:
    """A 400 naming every field the server would not honour, with the reason for each."""
    names = unsupported_fields(req, table)
    if names:
        reasons = "; ".join(f"{name}: {_reason(name, table)}" for name in names)
        raise bad_request(f"Unsupported parameters ({reasons}).", param=names[0], code="unsupported_parameter")


def markdown_table(table: ParameterTable = CHAT_AND_COMPLETIONS) -> str:
    """A table of docs/parameters.md."""
    rows = ["| parameter | what loraplex does |", "|---|---|"]
    rows += [f"| `{name}` | honoured: {how} |" for name, how in table.honoured.items()]
    rows += [f"| `{name}` | accepted, no effect: {why} |" for name, why in table.no_ops.items()]
    for name, why in table.refused.items():
        nothing = ""
        if name in table.asks_nothing:
            nothing = f" (`{name}: {json.dumps(table.asks_nothing[name])}` accepted)"
        rows.append(f"| `{name}` | refused, 400 `unsupported_parameter`: {why}{nothing} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
