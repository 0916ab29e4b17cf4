"""OpenAI wire format of Files and Batches (the `openai` SDK's `types/file_object.py` and `types/batch.py`), and
the lines of batch input, output and error files."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]
# OpenAI accepts only "24h"; shorter windows are ours (tests, short jobs). Up to a week.
WINDOW = re.compile(r"^([1-9][0-9]{0,5})([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MAX_WINDOW_S = 7 * 24 * 3600
MAX_METADATA_PAIRS = 16


def window_seconds(window: str) -> int:
    """`"24h"` -> 86400; ValueError for anything else than a count of s, m or h up to a week."""
    match = WINDOW.fullmatch(window)
    if match is None:
        raise ValueError(f"completion_window must look like '24h' (a count of s, m or h), got {window!r}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"completion_window is longer than a week: {window!r}")
    return seconds


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: Endpoint
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        window_seconds(value)
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (len(value) > MAX_METADATA_PAIRS
                                  or any(len(k) > 64 or len(v) > 512 for k, v in value.items())):
            raise ValueError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs, keys up to 64 characters and "
                             "values up to 512")
        return value


class BatchRequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class InputLine(BaseModel):
    """One line of an input file: `{"custom_id", "method", "url", "body"}`."""

    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


class LineResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    code: str
    message: str


class OutputLine(BaseModel):
    """One line of an output or error file, matched to its input by `custom_id`."""

    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None = None
