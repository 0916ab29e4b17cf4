"""Files and Batches for one tenant at a time: what the routes call. No FastAPI here.

A tenant sees only its own files and batches: another tenant's id gets the same 404 as an id that does not
exist.
"""

from __future__ import annotations

import json
import time
import uuid

from adapters.store import BlobNotFound
from api.auth import Caller
from api.batch.config import BatchConfig
from api.batch.files import FileBlobs
from api.batch.protocol import (
    Batch,
    BatchCreateRequest,
    BatchErrors,
    BatchList,
    BatchRequestCounts,
    FileDeleted,
    FileList,
    FileObject,
    window_seconds,
)
from api.batch.runner import BatchRunner
from api.batch.store import BatchStore
from api.errors import OpenAIError, bad_request

INPUT_PURPOSE = "batch"
MAX_PAGE = 100


def not_found(kind: str, object_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such {kind} object: {object_id}", param="id", code=f"{kind.lower()}_not_found")


def file_object(row: dict) -> FileObject:
    return FileObject(id=row["id"], bytes=row["bytes"], created_at=row["created_at"], filename=row["filename"],
                      purpose=row["purpose"])


def errors_of(row: dict) -> BatchErrors | None:
    return BatchErrors.model_validate_json(row["errors"]) if row.get("errors") else None


def batch_object(row: dict, counts: dict[str, int]) -> Batch:
    fields = {k: row[k] for k in Batch.model_fields if k in row and k not in ("errors", "metadata")}
    return Batch(**fields, errors=errors_of(row), metadata=json.loads(row["metadata"]) if row["metadata"] else None,
                 request_counts=BatchRequestCounts(total=sum(counts.values()), completed=counts["done"],
                                                   failed=counts["failed"]))


class BatchService:
    def __init__(self, store: BatchStore, blobs: FileBlobs, runner: BatchRunner, config: BatchConfig):
        self.store = store
        self.blobs = blobs
        self.runner = runner
        self.config = config

    # ------------------------------------------------------------------ files

    def upload(self, caller: Caller, filename: str, purpose: str, content: bytes) -> FileObject:
        if purpose != INPUT_PURPOSE:
            raise bad_request(f"purpose must be {INPUT_PURPOSE!r} (the only one this server takes), got {purpose!r}.",
                              param="purpose")
        if len(content) > self.config.files_max_bytes:
            raise OpenAIError(413, f"The file is larger than {self.config.files_max_bytes} bytes.", param="file",
                              code="file_too_large")
        if not content.strip():
            raise bad_request("The file is empty.", param="file", code="empty_file")
        try:
            content.decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad_request(f"The file is not UTF-8 text (JSON lines): {e}", param="file",
                              code="invalid_file") from e
        lines = sum(1 for line in content.split(b"\n") if line.strip())
        if lines > self.config.batch_max_lines:
            raise bad_request(f"The file has {lines} lines; a batch takes at most {self.config.batch_max_lines}.",
                              param="file", code="too_many_lines")
        file_id = f"file-{uuid.uuid4().hex}"
        self.blobs.put(file_id, content)
        return file_object(self.store.add_file(file_id, caller.tenant, purpose, filename[:255] or "upload.jsonl",
                                               len(content)))

    def file(self, caller: Caller, file_id: str) -> FileObject:
        return file_object(self._file_row(caller, file_id))

    def files(self, caller: Caller, limit: int = MAX_PAGE) -> FileList:
        return FileList(data=[file_object(r) for r in self.store.files(caller.tenant, min(limit, MAX_PAGE))])

    def content(self, caller: Caller, file_id: str) -> bytes:
        self._file_row(caller, file_id)
        try:
            return self.blobs.get(file_id)
        except BlobNotFound as e:
            raise not_found("File", file_id) from e

    def delete(self, caller: Caller, file_id: str) -> FileDeleted:
        self._file_row(caller, file_id)
        self.store.delete_file(file_id, caller.tenant)
        self.blobs.delete(file_id)
        return FileDeleted(id=file_id)

    def _file_row(self, caller: Caller, file_id: str) -> dict:
        row = self.store.file(file_id, caller.tenant)
        if row is None:
            raise not_found("File", file_id)
        return row

    # ------------------------------------------------------------------ batches

    def create(self, caller: Caller, req: BatchCreateRequest) -> Batch:
        row = self.store.file(req.input_file_id, caller.tenant)
        if row is None:
            raise not_found("File", req.input_file_id)
        if row["purpose"] != INPUT_PURPOSE:
            raise bad_request(f"File {req.input_file_id} has purpose {row['purpose']!r}; a batch reads a file "
                              f"uploaded with purpose {INPUT_PURPOSE!r}.", param="input_file_id")
        now = int(time.time())
        batch_id = f"batch_{uuid.uuid4().hex}"
        self.store.add_batch({
            "id": batch_id, "tenant": caller.tenant, "endpoint": req.endpoint, "input_file_id": req.input_file_id,
            "completion_window": req.completion_window, "status": "validating", "created_at": now,
            "expires_at": now + window_seconds(req.completion_window),
            "metadata": json.dumps(req.metadata) if req.metadata is not None else None,
        })
        self.runner.wake()
        return self.retrieve(caller, batch_id)

    def retrieve(self, caller: Caller, batch_id: str) -> Batch:
        row = self.store.batch(batch_id, caller.tenant)
        if row is None:
            raise not_found("Batch", batch_id)
        return batch_object(row, self.store.counts(batch_id))

    def list(self, caller: Caller, after: str | None, limit: int) -> BatchList:
        if not 1 <= limit <= MAX_PAGE:
            raise bad_request(f"limit must be between 1 and {MAX_PAGE}.", param="limit")
        rows = self.store.batches(caller.tenant, after, limit + 1)
        page = [batch_object(r, self.store.counts(r["id"])) for r in rows[:limit]]
        return BatchList(data=page, first_id=page[0].id if page else None, last_id=page[-1].id if page else None,
                         has_more=len(rows) > limit)

    def dashboard_rows(self, limit: int = 20) -> list[dict]:
        """The newest batches of every tenant, for the operator dashboard (admin only)."""
        rows = []
        for row in self.store.batches(None, None, limit):
            counts = self.store.counts(row["id"])
            total = sum(counts.values())
            rows.append({"id": row["id"], "tenant": row["tenant"], "status": row["status"],
                         "endpoint": row["endpoint"], "total": total, "finished": total - counts["pending"],
                         "failed": counts["failed"]})
        return rows

    def cancel(self, caller: Caller, batch_id: str) -> Batch:
        row = self.store.batch(batch_id, caller.tenant)
        if row is None:
            raise not_found("Batch", batch_id)
        if row["status"] in ("cancelling", "cancelled"):
            return self.retrieve(caller, batch_id)
        if not self.store.set_status(batch_id, "cancelling", "cancelling_at", only_from=("validating", "in_progress")):
            raise OpenAIError(409, f"Cannot cancel a batch with status {row['status']}.", param="id",
                              code="batch_not_cancellable")
        self.runner.wake()
        return self.retrieve(caller, batch_id)
