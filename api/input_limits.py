"""How big a request may be, from its bytes on the wire to the sequences it asks the engine for.

Every limit is a flag of `loraplex serve` (generated from this model); a request over one gets an
OpenAI-shaped 4xx naming it, and the server is unharmed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.errors import bad_request

MIB = 2**20


class InputLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(default=8 * MIB, ge=1024, description="Largest request body in bytes, except "
                                "adapter uploads (max_upload_bytes); larger bodies get a 413.")
    max_header_bytes: int = Field(default=64 * 1024, ge=4096, description="Largest request line plus headers in "
                                  "bytes; a larger request is answered with a 431 and the connection closed.")
    max_json_depth: int = Field(default=32, ge=4, description="Deepest nesting of objects and arrays in a JSON "
                                "body.")
    max_prompts: int = Field(default=64, ge=1, description="Most prompts in one completions request.")
    max_messages: int = Field(default=1024, ge=1, description="Most messages in one chat request.")
    max_stop_chars: int = Field(default=256, ge=1, description="Longest stop string, in characters.")
    max_sequences: int = Field(default=64, ge=1, description="Most sequences one request may run: prompts "
                               "times n.")


def check_request_size(limits: InputLimits, *, prompts: int, n: int, stop: str | list[str] | None,
                       messages: int = 0) -> None:
    """A 400 naming every limit the request is over (prompts, messages, stop strings, sequences)."""
    problems: list[tuple[str, str]] = []
    if prompts > limits.max_prompts:
        problems.append(("prompt", f"{prompts} prompts, more than the {limits.max_prompts} allowed"))
    if messages > limits.max_messages:
        problems.append(("messages", f"{messages} messages, more than the {limits.max_messages} allowed"))
    for i, text in enumerate([stop] if isinstance(stop, str) else stop or []):
        if len(text) > limits.max_stop_chars:
            problems.append((f"stop[{i}]" if not isinstance(stop, str) else "stop",
                             f"a stop string of {len(text)} characters, longer than {limits.max_stop_chars}"))
    if prompts * n > limits.max_sequences:
        problems.append(("n", f"{prompts} prompt(s) x n={n} = {prompts * n} sequences, more than the "
                              f"{limits.max_sequences} one request may run"))
    if problems:
        raise bad_request("The request is too large: " + "; ".join(text for _, text in problems) + ".",
                          param=problems[0][0], code="request_too_large")
