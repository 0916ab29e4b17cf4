"""An input file's lines, checked one by one: every problem reported with its line number. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.batch.protocol import BatchError, InputLine
from api.errors import from_validation_error

MAX_ERRORS = 1000  # a file that is wrong everywhere is not reported a million times


@dataclass(frozen=True)
class ParsedLine:
    line: int  # 1-based, as an editor numbers the file
    custom_id: str
    body: dict[str, Any]


def parse_lines(raw: bytes, endpoint: str, max_lines: int) -> tuple[list[ParsedLine], list[BatchError]]:
    """The well-formed request lines of a JSONL file and the problems of the others (blank lines are skipped):
    not JSON, not a request line, a `url` other than the batch's `endpoint`, a `custom_id` already used."""
    lines: list[ParsedLine] = []
    errors: list[BatchError] = []
    seen: dict[str, int] = {}
    numbered = [(n, text) for n, text in enumerate(raw.split(b"\n"), start=1) if text.strip()]
    if not numbered:
        return [], [BatchError(code="empty_file", message="The input file holds no request lines.")]
    if len(numbered) > max_lines:
        return [], [BatchError(code="too_many_requests",
                               message=f"The input file has {len(numbered)} lines; a batch takes at most "
                                       f"{max_lines}.")]
    for n, text in numbered:
        try:
            parsed = parse_line(text, endpoint)
        except LineProblem as e:
            errors.append(BatchError(code=e.code, message=e.message, param=e.param, line=n))
            continue
        if parsed.custom_id in seen:
            errors.append(BatchError(code="duplicate_custom_id", param="custom_id", line=n,
                                     message=f"custom_id {parsed.custom_id!r} is already used on line "
                                             f"{seen[parsed.custom_id]}; each line needs its own."))
            continue
        seen[parsed.custom_id] = n
        lines.append(ParsedLine(n, parsed.custom_id, parsed.body))
    return lines, errors[:MAX_ERRORS]


class LineProblem(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def parse_line(text: bytes, endpoint: str) -> InputLine:
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LineProblem("invalid_json_line", f"This line is not valid JSON: {e}") from e
    if not isinstance(payload, dict):
        raise LineProblem("invalid_json_line", "This line is not a JSON object.")
    try:
        line = InputLine.model_validate(payload)
    except ValidationError as e:
        error = from_validation_error(e)
        raise LineProblem("invalid_request", error.message, error.param) from e
    if line.url != endpoint:
        raise LineProblem("mismatched_endpoint", f"The line's url is {line.url!r}; this batch's endpoint is "
                          f"{endpoint!r}.", "url")
    return line
