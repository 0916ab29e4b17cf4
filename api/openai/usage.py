"""A request's account as the OpenAI `usage` object."""

from __future__ import annotations

from api.generation.accounting import RequestAccount
from api.openai.protocol import Usage


def usage_of(account: RequestAccount) -> Usage:
    return Usage.of(account.prompt_tokens, account.completion_tokens, account.cached_prompt_tokens)
