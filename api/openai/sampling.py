"""From a validated request and its output budget to vLLM SamplingParams. Pure."""

from __future__ import annotations

import dataclasses

from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from api.errors import bad_request
from api.openai.protocol import SamplingFields


def token_ids_outside(ids: list[int], vocab_size: int) -> list[int]:
    return [t for t in ids if not 0 <= t < vocab_size]


def logit_bias_of(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's string keys as token ids; a 400 naming every key that is not a token id of this vocabulary."""
    if not bias:
        return None
    bad = [key for key in bias if not key.isdigit() or int(key) >= vocab_size]
    if bad:
        raise bad_request(f"logit_bias keys must be token ids in [0, {vocab_size}); not {bad[:5]}",
                          param="logit_bias")
    return {int(key): value for key, value in bias.items()}


def build_sampling_params(req: SamplingFields, max_tokens: int, num_logprobs: int | None, vocab_size: int,
                          structured: StructuredOutputsParams | None = None) -> SamplingParams:
    if req.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({req.min_tokens}) must not exceed max_tokens ({max_tokens})",
                          param="min_tokens")
    outside = token_ids_outside(req.stop_token_ids or [], vocab_size)
    if outside:
        raise bad_request(f"stop_token_ids {outside[:5]} are outside the vocabulary [0, {vocab_size}).",
                          param="stop_token_ids")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    try:
        return SamplingParams(
            n=req.n,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            min_p=req.min_p or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            seed=req.seed,
            stop=stop or None,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            logprobs=num_logprobs,
            logit_bias=logit_bias_of(req.logit_bias, vocab_size),
            # vLLM records its backend choice on the constraint: each call gets its own copy.
            structured_outputs=dataclasses.replace(structured) if structured is not None else None,
        )
    except ValueError as e:
        raise bad_request(str(e)) from e
