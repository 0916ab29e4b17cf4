"""From a validated request to vLLM SamplingParams, including the context-length check. Pure functions."""

from __future__ import annotations

from vllm import SamplingParams

from api.errors import bad_request
from api.protocol import SamplingFields


def resolve_max_tokens(prompt_len: int, requested: int | None, max_model_len: int, prompt_param: str,
                       limit_param: str = "max_tokens") -> int:
    """Tokens the completion may use. With no limit asked, whatever context is left (as OpenAI does)."""
    if prompt_len == 0:
        raise bad_request("The prompt is empty after tokenization.", param=prompt_param)
    room = max_model_len - prompt_len
    if room < 1:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens, which leaves no room for a completion.",
            param=prompt_param, code="context_length_exceeded",
        )
    if requested is None:
        return room
    if requested > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. You requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the completion). "
            f"Reduce the prompt or {limit_param}.",
            param=limit_param, code="context_length_exceeded",
        )
    return requested


def build_sampling_params(req: SamplingFields, max_tokens: int, num_logprobs: int | None) -> SamplingParams:
    if req.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({req.min_tokens}) must not exceed max_tokens ({max_tokens})",
                          param="min_tokens")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        return SamplingParams(
            n=req.n,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            seed=req.seed,
            stop=stop or None,
            ignore_eos=req.ignore_eos,
            logprobs=num_logprobs,
        )
    except ValueError as e:
        raise bad_request(str(e)) from e
