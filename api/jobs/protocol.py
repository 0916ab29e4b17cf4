"""Wire format of async jobs (ours: OpenAI has no such API)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

JobStatus = Literal["queued", "in_progress", "completed", "failed"]
WEBHOOK_FIELD = "webhook_url"  # taken out of the request body before it is validated as the endpoint's request


class AsyncJob(BaseModel):
    id: str
    object: Literal["async.job"] = "async.job"
    endpoint: str
    status: JobStatus
    created_at: int
    completed_at: int | None = None
    expires_at: float | None = None  # when the result is dropped (unix time)
    status_code: int | None = None  # of the response, once finished
    response: dict[str, Any] | None = None  # the completion, as the live endpoint returns it
    error: dict[str, Any] | None = None  # the OpenAI error object, when it failed


class WebhookEvent(BaseModel):
    """POSTed to the job's webhook when it finishes; fetch the result with GET /v1/async/{id}."""

    id: str
    object: Literal["async.job.event"] = "async.job.event"
    status: JobStatus
