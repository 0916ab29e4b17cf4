"""The batch loop: validates new batches, runs pending lines at background priority, finalizes, cancels and
expires (lines already running finish first). State lives in the batch store, so a restarted server picks up exactly where the killed one stopped.

Each line runs through the live pipeline (`GenerationService.create` with a `BatchLane`): it waits for engine
capacity that live traffic leaves free, and is preempted (its engine request aborted, the line left pending
and run again later) when a live request needs the slot. A line refused for a passing reason (rate limit,
overload) is retried after `batch_retry_s`; one refused for good is failed with its error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from adapters.store import BlobNotFound
from api.auth import Caller
from api.batch.config import BatchConfig
from api.batch.files import FileBlobs
from api.batch.lines import Endpoints, billing_key, check_line, output_line, parse_request
from api.batch.protocol import BatchError, BatchErrors
from api.batch.store import BatchStore, LineResult, LineRow
from api.batch.validation import parse_lines
from api.errors import OpenAIError
from api.pipeline.request import BatchLane
from api.observability.request_metrics import BatchGauges
from api.tenancy.config import TenancyConfig

logger = logging.getLogger(__name__)

TICK_S = 1.0  # expiry and cancels made by another process (the CLI) are seen within this
RETRYABLE = (429, 503)
OUTPUT_PURPOSE = "batch_output"


def output_file_id(batch_id: str, kind: str) -> str:
    """Fixed per batch, so a finalize resumed after a crash rewrites the same file instead of adding one."""
    return f"file-{batch_id}-{kind}"


class _Running:
    """A line in flight: its task, and whether it was told to stop (preempted or its batch closed)."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped and self.task is not None:
            self.stopped = True
            self.task.cancel()


class BatchRunner:
    def __init__(self, store: BatchStore, blobs: FileBlobs, endpoints: Endpoints, tenancy: TenancyConfig,
                 config: BatchConfig, is_draining: Callable[[], bool],
                 may_start: Callable[[], bool] = lambda: True):
        """`may_start`: whether admission would give a batch line a slot now. While it would not (live traffic,
        or its quiet period), no line is taken from the store: its preparation (resolve, tokenize) would only
        take event-loop time from the live requests, to wait."""
        self.store = store
        self._may_start = may_start
        self.blobs = blobs
        self.endpoints = endpoints
        self.tenancy = tenancy
        self.config = config
        self._is_draining = is_draining
        self._wake = asyncio.Event()
        self._running: dict[tuple[str, int], _Running] = {}
        self._retry_at: dict[tuple[str, int], float] = {}
        self._validating: dict[str, asyncio.Task] = {}
        self.preemptions = 0
        self.lines_finished = 0

    def gauges(self, holding_slots: int) -> BatchGauges:
        """`holding_slots`: the lines admission has granted engine slots (the rest of those in flight wait)."""
        lines: dict[str, int] = {}
        for counts in self.store.all_counts().values():
            for state, n in counts.items():
                lines[state] = lines.get(state, 0) + n
        return BatchGauges(self.store.status_counts(), lines, holding_slots,
                           max(0, len(self._running) - holding_slots), self.preemptions)

    def wake(self) -> None:
        self._wake.set()

    @property
    def running_lines(self) -> int:
        return len(self._running)

    async def run(self) -> None:
        """For the life of the server. Unfinished batches of a previous run are simply found in the store."""
        while True:
            try:
                self.tick()
            except Exception:
                logger.exception("batch runner tick failed; trying again")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            except asyncio.TimeoutError:
                pass

    def stop_all(self) -> None:
        """Shutdown: every running line stops and stays pending, to run again at the next start."""
        for running in list(self._running.values()):
            running.stop()
        for task in self._validating.values():
            task.cancel()

    def tick(self) -> None:
        now = time.time()
        for batch in self.store.unfinished():
            status, batch_id = batch["status"], batch["id"]
            if status == "validating":
                if batch_id not in self._validating and not self._is_draining():
                    task = asyncio.ensure_future(self._validate(batch))
                    self._validating[batch_id] = task
                    task.add_done_callback(lambda t, b=batch_id: self._validating.pop(b, None))
            elif status == "cancelling":
                self._close(batch, "cancelled", "cancelled_at")
            elif status == "in_progress" and now >= batch["expires_at"]:
                self._close(batch, "expired", "expired_at")
            elif status == "finalizing" or (status == "in_progress" and not self._has_work(batch_id)):
                self._finalize(batch, "completed", "completed_at")
        if not self._is_draining() and self._may_start():
            self._dispatch()

    def _has_work(self, batch_id: str) -> bool:
        if any(key[0] == batch_id for key in self._running):
            return True
        return self.store.counts(batch_id)["pending"] > 0

    def _dispatch(self) -> None:
        room = self.config.batch_max_running_lines - len(self._running)
        if room <= 0:
            return
        now = time.monotonic()
        waiting = {key for key, at in self._retry_at.items() if at > now}
        for row in self.store.pending_lines(room, set(self._running) | waiting):
            key = (row.batch_id, row.line)
            self._retry_at.pop(key, None)
            running = _Running()
            self._running[key] = running
            running.task = asyncio.ensure_future(self._run_line(row, running))

    async def _run_line(self, row: LineRow, running: _Running) -> None:
        key = (row.batch_id, row.line)
        endpoint = self.endpoints[row.endpoint]
        attempt = f"{billing_key(row.batch_id, row.line)}#{uuid.uuid4().hex[:8]}"

        def preempt() -> None:
            self.preemptions += 1
            running.stop()

        try:
            try:
                req = parse_request(endpoint, row.body)
                reply = await endpoint.service.create(req, Caller(tenant=row.tenant), attempt,
                                                      BatchLane(billing_key(row.batch_id, row.line), preempt))
                body = reply.body.model_dump(exclude_none=False)
                result = LineResult("done", 200, attempt, body)
            except asyncio.CancelledError:
                if not running.stopped:
                    raise
                asyncio.current_task().uncancel()
                return  # preempted or closed: still pending in the store
            except OpenAIError as e:
                if e.status in RETRYABLE:
                    self._retry_at[key] = time.monotonic() + self.config.batch_retry_s
                    return
                result = LineResult("failed", e.status, attempt, e.body())
            except Exception:
                logger.exception("batch %s line %d failed", row.batch_id, row.line)
                error = OpenAIError(500, "Internal server error.", code="internal_error")
                result = LineResult("failed", 500, attempt, error.body())
            if self.store.finish_line(row.batch_id, row.line, result):
                self.lines_finished += 1
        finally:
            self._running.pop(key, None)
            self.wake()

    async def _validate(self, batch: dict) -> None:
        """validating -> in_progress with its lines, or -> failed with every problem and its line number."""
        batch_id, tenant = batch["id"], batch["tenant"]
        try:
            raw = await asyncio.to_thread(self.blobs.get, batch["input_file_id"])
        except BlobNotFound:
            self._fail(batch_id, [BatchError(code="file_not_found", message="The input file's content is gone.")])
            return
        endpoint = self.endpoints[batch["endpoint"]]
        parsed, errors = parse_lines(raw, batch["endpoint"], self.config.batch_max_lines)
        caller, tokens, lines = Caller(tenant=tenant), 0, []
        for line in parsed:
            try:
                tokens += await check_line(endpoint, line.body, caller)
                lines.append((line.line, line.custom_id, line.body))
            except OpenAIError as e:
                errors.append(BatchError(code=e.code or "invalid_request", message=e.message, param=e.param,
                                         line=line.line))
            await asyncio.sleep(0)  # a long file does not hold up live requests
        limit = self.tenancy.tenant(tenant).limits.max_batch_queued_tokens
        if not errors and limit is not None and self.store.reserved_tokens(tenant) + tokens > limit:
            errors.append(BatchError(code="token_limit_exceeded", message=(
                f"This batch needs about {tokens} tokens; with the tenant's unfinished batches that is over its "
                f"limit of {limit} queued batch tokens. Retry once some have finished.")))
        if errors:
            errors.sort(key=lambda e: e.line or 0)
            self._fail(batch_id, errors)
            return
        self.store.start(batch_id, lines, tokens)
        self.wake()

    def _fail(self, batch_id: str, errors: list[BatchError]) -> None:
        self.store.set_status(batch_id, "failed", "failed_at", only_from=("validating",),
                              errors=BatchErrors(data=errors).model_dump_json())

    def _close(self, batch: dict, status: str, when: str) -> None:
        """Cancel or expire: lines not started are closed; lines in flight finish (as OpenAI's do), then the
        finished ones go to the output file."""
        batch_id = batch["id"]
        task = self._validating.get(batch_id)
        if task is not None:
            task.cancel()
        in_flight = {line for b, line in self._running if b == batch_id}
        self.store.close_pending(batch_id, status, keep=in_flight)
        if not in_flight:
            self._finalize(batch, status, when)

    def _finalize(self, batch: dict, status: str, when: str) -> None:
        """Writes the output file (lines that succeeded) and the error file (the rest), then the final status."""
        batch_id = batch["id"]
        if batch["status"] == "in_progress":
            self.store.set_status(batch_id, "finalizing", "finalizing_at")
        output, errors = [], []
        for row in self.store.finished_lines(batch_id):
            (output if row["state"] == "done" else errors).append(output_line(batch_id, row))
        files = {}
        for kind, lines in (("output", output), ("error", errors)):
            if lines:
                file_id = output_file_id(batch_id, kind)
                content = ("\n".join(lines) + "\n").encode()
                self.blobs.put(file_id, content)
                self.store.put_file(file_id, batch["tenant"], OUTPUT_PURPOSE, f"{batch_id}_{kind}.jsonl",
                                    len(content))
                files[f"{kind}_file_id"] = file_id
        self.store.set_status(batch_id, status, when, **files)
        logger.info("batch %s %s: %d succeeded, %d not", batch_id, status, len(output), len(errors))
