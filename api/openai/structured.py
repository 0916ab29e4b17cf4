"""Structured outputs: `response_format` or vLLM's `structured_outputs` as the engine's constraint, checked first.

vLLM compiles a request's schema, regex or grammar on the serving process's event loop before the engine sees
it, where a slow one would stall every stream. So a constraint is checked here before that: its patterns'
repetition counts are bounded (a schema `pattern` compiles in time quadratic in them: `[a-z]{1,9000}` took
4.6 s, `{1,1000}` 46 ms), then it is compiled once in a worker thread under a time limit. A constraint that
fails is a 400 naming the field. JSON output is made strict JSON on its way out (`json_safe`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from vllm import SamplingParams
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

from api.errors import bad_request
from api.openai.protocol import MAX_CONSTRAINT_CHARS, ChatCompletionRequest, SamplingFields
from api.openai.tools import tool_schema
from engine.types import ChoiceDelta

# Sum of the upper bounds of a pattern's counted repetitions (`{m,n}`).
MAX_REPEAT_TOTAL = 1024
COMPILE_TIMEOUT_S = 5.0
_COUNTED = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def constraint_of(req: SamplingFields) -> tuple[StructuredOutputsParams | None, str]:
    """The engine's constraint for the request, and the request field it came from. (The engine compiles JSON
    without free whitespace and every schema strictly: `engine/async_engine.py`.)"""
    fmt, so = req.response_format, req.structured_outputs
    forced = req.forced_tool_choice() if isinstance(req, ChatCompletionRequest) else None
    if forced is not None:
        if so is not None or (fmt is not None and fmt.type != "text"):
            raise bad_request("A forced tool call constrains the output, and so does response_format or "
                              "structured_outputs: send one.", param="tool_choice")
        return StructuredOutputsParams(json=tool_schema(req.tools, forced, req.parallel_tool_calls)), "tools"
    if fmt is not None and fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True), "response_format"
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        return StructuredOutputsParams(json=fmt.json_schema.schema_), "response_format"
    if so is None:
        return None, ""
    if so.json_ is not None:
        return StructuredOutputsParams(json=so.json_), "structured_outputs.json"
    if so.json_object:
        return StructuredOutputsParams(json_object=True), "structured_outputs"
    if so.regex is not None:
        return StructuredOutputsParams(regex=so.regex), "structured_outputs.regex"
    if so.choice is not None:
        return StructuredOutputsParams(choice=list(so.choice)), "structured_outputs.choice"
    return StructuredOutputsParams(grammar=so.grammar), "structured_outputs.grammar"


def repeat_total(pattern: str) -> int:
    """Sum of the upper bounds of `pattern`'s counted repetitions (an open `{m,}` counts m)."""
    total = 0
    for low, high in _COUNTED.findall(pattern):
        total += int(high) if high else int(low)
    return total


def _patterns(schema: Any) -> Iterator[str]:
    """Every regular expression in a JSON schema: `pattern` values and `patternProperties` keys."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from value
            yield from _patterns(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _patterns(item)


def _schema_patterns(so: StructuredOutputsParams) -> list[str]:
    if so.regex is not None:
        return [so.regex]
    if so.json is None:
        return []
    schema = so.json
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError:
            return []  # the compile below reports it
    return list(_patterns(schema))


async def checked_constraint(req: SamplingFields) -> StructuredOutputsParams | None:
    """The request's constraint, or None; a 400 naming the field when it is too costly or does not compile."""
    so, param = constraint_of(req)
    if so is None:
        return None
    if isinstance(so.json, dict) and len(json.dumps(so.json)) > MAX_CONSTRAINT_CHARS:
        raise bad_request(f"The schema is {len(json.dumps(so.json))} characters as JSON, more than the "
                          f"{MAX_CONSTRAINT_CHARS} allowed.", param=param, code="constraint_too_large")
    for pattern in _schema_patterns(so):
        if repeat_total(pattern) > MAX_REPEAT_TOTAL:
            raise bad_request(f"The pattern {pattern[:80]!r} repeats up to {repeat_total(pattern)} times in all, more "
                              f"than the {MAX_REPEAT_TOTAL} allowed (its compile time grows with the square).",
                              param=param, code="constraint_too_large")
    # vLLM's own check (it rewrites a choice into a grammar, so it gets a copy).
    probe = SamplingParams(structured_outputs=dataclasses.replace(so))
    try:
        await asyncio.wait_for(asyncio.to_thread(validate_xgrammar_grammar, probe), COMPILE_TIMEOUT_S)
    except TimeoutError as e:
        raise bad_request(f"The output constraint did not compile within {COMPILE_TIMEOUT_S:.0f} s.", param=param,
                          code="constraint_too_large") from e
    except (ValueError, VLLMClientError) as e:
        cause = f": {e.__cause__}" if e.__cause__ is not None else ""
        raise bad_request(f"The output constraint is not supported: {e}{cause}", param=param) from e
    return so


_CONTROL = re.compile(r"[\x00-\x1f]")
_SHORT_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """Raw control characters as JSON escapes. xgrammar 0.2.8 lets them into JSON strings, which strict JSON (and
    pydantic, so the openai SDK's `parse`) refuses; with no free whitespace, a JSON output holds them nowhere else."""
    return _CONTROL.sub(lambda m: _SHORT_ESCAPES.get(m.group(), f"\\u{ord(m.group()):04x}"), text)


def constrained_to_json(req: SamplingFields) -> bool:
    so, _ = constraint_of(req)
    return so is not None and (so.json is not None or bool(so.json_object))


def json_safe(req: SamplingFields, deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChoiceDelta]:
    """The deltas, their text made strict JSON where the request constrained it to JSON; any other stream is
    returned as it is (no extra step per token)."""
    return _escaped(deltas) if constrained_to_json(req) else deltas


async def _escaped(deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChoiceDelta]:
    async for d in deltas:
        yield dataclasses.replace(d, text=escape_controls(d.text)) if _CONTROL.search(d.text) else d
