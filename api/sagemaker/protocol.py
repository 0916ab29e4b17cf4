"""SageMaker's wire format: the custom-attributes header and which OpenAI request an /invocations body is."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum
from typing import Any

CUSTOM_ATTRIBUTES_HEADER = "x-amzn-sagemaker-custom-attributes"
MODEL_ATTRIBUTE = "model"
_SEPARATORS = re.compile(r"[,;]")


class InvocationKind(str, Enum):
    CHAT = "chat"
    COMPLETION = "completion"


def parse_custom_attributes(value: str | None) -> dict[str, str]:
    """`key=value` pairs of the header, separated by commas or semicolons, whitespace around them dropped.

    The header is free text the caller shares with every container behind the endpoint: an entry without `=`
    is someone else's flag and is skipped; a value may itself contain `=`. A key given twice with different
    values is ambiguous: ValueError.
    """
    attributes: dict[str, str] = {}
    for entry in _SEPARATORS.split(value or ""):
        key, sep, val = entry.partition("=")
        key, val = key.strip(), val.strip()
        if not sep or not key:
            continue
        if attributes.get(key, val) != val:
            raise ValueError(f"{key!r} is given twice, as {attributes[key]!r} and {val!r}")
        attributes[key] = val
    return attributes


def invocation_kind(payload: Mapping[str, Any]) -> InvocationKind:
    """Chat when the body has `messages`, completions when it has `prompt`; ValueError for neither or both."""
    has_messages, has_prompt = "messages" in payload, "prompt" in payload
    if has_messages and has_prompt:
        raise ValueError("The body has both 'messages' (chat) and 'prompt' (completions); send one.")
    if has_messages:
        return InvocationKind.CHAT
    if has_prompt:
        return InvocationKind.COMPLETION
    raise ValueError("The body needs 'messages' (OpenAI chat shape) or 'prompt' (OpenAI completions shape).")
