"""From a validated request and its output budget to vLLM SamplingParams. Pure."""

from __future__ import annotations

from vllm import SamplingParams

from api.errors import bad_request
from api.openai.protocol import SamplingFields


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
