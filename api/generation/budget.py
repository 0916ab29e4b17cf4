"""The output budget: how many tokens a completion may generate. Decided here and nowhere else. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import bad_request


@dataclass(frozen=True)
class OutputLimit:
    """What the request asked for (None: nothing) and which field asked, for errors to name."""

    tokens: int | None
    param: str = "max_tokens"  # or "max_completion_tokens"


def output_budget(prompt_len: int, limit: OutputLimit, tenant_cap: int | None, max_model_len: int,
                  prompt_param: str) -> int:
    """Tokens the completion may use, or a 400 naming the right `param`.

    A request without a limit gets what the context leaves (as OpenAI does), bounded by the tenant's cap;
    a request above the cap is refused rather than silently cut.
    """
    if prompt_len == 0:
        raise bad_request("The prompt is empty after tokenization.", param=prompt_param)
    if tenant_cap is not None and limit.tokens is not None and limit.tokens > tenant_cap:
        raise bad_request(f"{limit.param} is {limit.tokens}, above this tenant's limit of {tenant_cap}.",
                          param=limit.param)
    room = max_model_len - prompt_len
    if room < 1:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens, which leaves no room for a completion.",
            param=prompt_param, code="context_length_exceeded",
        )
    if limit.tokens is None:
        return room if tenant_cap is None else min(room, tenant_cap)
    if limit.tokens > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. You requested "
            f"{prompt_len + limit.tokens} tokens ({prompt_len} in the prompt, {limit.tokens} for the "
            f"completion). Reduce the prompt or {limit.param}.",
            param=limit.param, code="context_length_exceeded",
        )
    return limit.tokens
