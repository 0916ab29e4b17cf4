"""Runs async jobs through the live pipeline (admitted and priced as live requests), keeps their results for
`async_result_ttl_s`, calls their webhooks. Jobs are rows in the batch store: a restarted server runs the ones
left unfinished, and billing is keyed by job id, so a job is billed once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

import httpx

from api.auth import Caller
from api.batch.config import BatchConfig
from api.batch.lines import Endpoints, parse_request
from api.batch.store import BatchStore, LineResult
from api.errors import OpenAIError
from api.pipeline.request import BatchLane
from api.jobs.protocol import WebhookEvent

logger = logging.getLogger(__name__)

RETRYABLE = (429, 503)
WEBHOOK_TIMEOUT_S = 5.0
PURGE_EVERY_S = 60.0


class JobRunner:
    def __init__(self, store: BatchStore, endpoints: Endpoints, config: BatchConfig):
        self.store = store
        self.endpoints = endpoints
        self.config = config
        self._tasks: dict[str, asyncio.Task] = {}

    def submit(self, job_id: str) -> None:
        if job_id not in self._tasks:
            task = asyncio.ensure_future(self._run(job_id))
            self._tasks[job_id] = task
            task.add_done_callback(lambda t: self._tasks.pop(job_id, None))

    async def run(self) -> None:
        """For the life of the server: resumes the jobs a previous run left, drops expired results."""
        for job in self.store.unfinished_jobs():
            self.submit(job["id"])
        while True:
            self.store.purge_jobs(time.time())
            await asyncio.sleep(PURGE_EVERY_S)

    def stop_all(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()

    async def _run(self, job_id: str) -> None:
        job = self.store.job(job_id)
        endpoint = self.endpoints[job["endpoint"]]
        self.store.set_job_status(job_id, "in_progress")
        while True:
            attempt = f"{job_id}#{uuid.uuid4().hex[:8]}"
            try:
                req = parse_request(endpoint, json.loads(job["body"]))
                reply = await endpoint.service.create(req, Caller(tenant=job["tenant"]), attempt, BatchLane(job_id))
                result = LineResult("done", 200, attempt, reply.body.model_dump(exclude_none=False))
            except OpenAIError as e:
                if e.status in RETRYABLE:
                    await asyncio.sleep(self.config.batch_retry_s)
                    continue
                result = LineResult("failed", e.status, attempt, e.body())
            except asyncio.CancelledError:
                raise  # shutdown: the job stays unfinished and runs again at the next start
            except Exception:
                logger.exception("async job %s failed", job_id)
                result = LineResult("failed", 500, attempt,
                                    OpenAIError(500, "Internal server error.", code="internal_error").body())
            break
        self.store.finish_job(job_id, result, self.config.async_result_ttl_s)
        if job["webhook_url"]:
            await self._call_back(job["webhook_url"], WebhookEvent(id=job_id, status=self.store.job(job_id)["status"]))

    async def _call_back(self, url: str, event: WebhookEvent) -> None:
        """One POST; a webhook that fails is logged, not retried (the result can still be polled)."""
        try:
            async with httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False) as client:
                response = await client.post(url, json=event.model_dump())
            if response.status_code >= 400:
                logger.warning("webhook of job %s answered %d", event.id, response.status_code)
        except httpx.HTTPError as e:
            logger.warning("webhook of job %s failed: %s", event.id, e)
