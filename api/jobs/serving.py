"""Async jobs for one tenant: submit (checked as the live request would be, then queued) and poll."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from api.auth import Caller
from api.batch.config import BatchConfig
from api.batch.lines import Endpoints, check_line
from api.batch.store import BatchStore
from api.errors import OpenAIError, bad_request
from api.jobs.protocol import WEBHOOK_FIELD, AsyncJob
from api.jobs.runner import JobRunner


def job_object(row: dict) -> AsyncJob:
    result = json.loads(row["result"]) if row["result"] else None
    failed = row["status"] == "failed"
    return AsyncJob(id=row["id"], endpoint=row["endpoint"], status=row["status"], created_at=row["created_at"],
                    completed_at=row["completed_at"], expires_at=row["expires_at"], status_code=row["status_code"],
                    response=None if failed else result, error=result.get("error") if failed and result else None)


def webhook_allowed(url: str, prefixes: tuple[str, ...]) -> bool:
    return any(url.startswith(prefix) for prefix in prefixes)


class JobService:
    def __init__(self, store: BatchStore, runner: JobRunner, endpoints: Endpoints, config: BatchConfig):
        self.store = store
        self.runner = runner
        self.endpoints = endpoints
        self.config = config

    async def submit(self, caller: Caller, endpoint: str, payload: dict[str, Any]) -> AsyncJob:
        webhook = payload.pop(WEBHOOK_FIELD, None)
        if webhook is not None and (not isinstance(webhook, str)
                                    or not webhook_allowed(webhook, self.config.webhook_prefixes())):
            raise bad_request("webhook_url is not on this server's allow-list (--async-webhook-prefixes).",
                              param=WEBHOOK_FIELD, code="webhook_not_allowed")
        await check_line(self.endpoints[endpoint], payload, caller)
        job_id = f"job_{uuid.uuid4().hex}"
        self.store.add_job(job_id, caller.tenant, endpoint, payload, webhook)
        self.runner.submit(job_id)
        return self.retrieve(caller, job_id)

    def retrieve(self, caller: Caller, job_id: str) -> AsyncJob:
        row = self.store.job(job_id, caller.tenant)
        if row is None or (row["expires_at"] is not None and row["expires_at"] <= time.time()):
            raise OpenAIError(404, f"No such async job: {job_id} (results are kept for "
                              f"{self.config.async_result_ttl_s:g} s)", param="id", code="job_not_found")
        return job_object(row)
