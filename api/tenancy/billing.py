"""The usage ledger's writer on the request path: no request is served unbilled.

A row that cannot be written is retried at once a few times; if it still fails it is kept in memory, its
tenant is refused new work (HTTP 503, `billing_unavailable`) and the row is retried in the background until
the ledger takes it. Refusing one tenant rather than serving unbilled was chosen because a lost row is also
lost from the budgets rebuilt from the ledger at restart; other tenants keep being served, since a tenant's
rows are the only ones its refusal protects. Rows still unwritten at shutdown are kept in a JSON-lines file
beside the ledger and written at the next start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid

from api.observability.outcome import RequestOutcome
from api.tenancy.ledger import LedgerError, UsageLedger

logger = logging.getLogger(__name__)

RETRY_DELAYS_S = (0.05, 0.25)  # before the second and third try


class LedgerWriter:
    """Thread-safe: `record` runs in worker threads, `is_blocked` on the event loop."""

    def __init__(self, ledger: UsageLedger, retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S):
        self.ledger = ledger
        self._delays = retry_delays_s
        self._lock = threading.Lock()
        self._pending: list[tuple[RequestOutcome, str]] = []
        self._blocked: frozenset[str] = frozenset()
        self.spill_path = ledger.path.with_name(ledger.path.name + ".pending.jsonl")
        self._load_spilled()

    def record(self, outcome: RequestOutcome, finish: str) -> None:
        """Writes the row (a reused request id gets a suffix, so no request goes unbilled); on failure keeps it
        pending and blocks its tenant."""
        self.record_many([(outcome, finish)])

    def record_many(self, rows: list[tuple[RequestOutcome, str]]) -> None:
        """`record` of requests that finished together, in one commit: all rows are written or all pending."""
        billed = [(outcome, finish) for outcome, finish in rows if outcome.billing != "none"]
        if not billed:
            return
        for delay in (0.0, *self._delays):
            if delay:
                time.sleep(delay)
            try:
                self.ledger.record_many(billed, _suffixed)
                return
            except LedgerError:
                logger.warning("usage rows of requests %s not written; retrying",
                               ", ".join(o.request_id for o, _ in billed), exc_info=True)
        logger.error("usage rows of requests %s kept pending: the ledger refuses writes; tenants %s are refused "
                     "new requests until they are written", ", ".join(o.request_id for o, _ in billed),
                     sorted({o.tenant for o, _ in billed}))
        with self._lock:
            self._pending.extend(billed)
            self._blocked = frozenset(o.tenant for o, _ in self._pending)

    def is_blocked(self, tenant: str) -> bool:
        return tenant in self._blocked

    @property
    def pending(self) -> int:
        return len(self._pending)

    def retry_pending(self) -> int:
        """One more try for every pending row; returns how many were written."""
        with self._lock:
            rows, self._pending = self._pending, []
        left, written = [], 0
        for outcome, finish in rows:
            try:
                self.ledger.record_many([(outcome, finish)], _suffixed)
                written += 1
            except LedgerError:
                left.append((outcome, finish))
        with self._lock:
            self._pending = left + self._pending
            self._blocked = frozenset(o.tenant for o, _ in self._pending)
        if written:
            logger.info("wrote %d pending usage row(s); %d left", written, len(self._pending))
        return written

    def spill(self) -> None:
        """At shutdown: rows the ledger never took go to the spill file, for the next start."""
        self.retry_pending()
        with self._lock:
            rows = list(self._pending)
        if not rows:
            return
        with self.spill_path.open("a") as f:
            for outcome, finish in rows:
                f.write(json.dumps({"outcome": dataclasses.asdict(outcome), "finish": finish}) + "\n")
        logger.error("%d usage row(s) could not be written; kept in %s for the next start", len(rows),
                     self.spill_path)

    def _load_spilled(self) -> None:
        if not self.spill_path.is_file():
            return
        rows = []
        for line in self.spill_path.read_text().splitlines():
            entry = json.loads(line)
            fields = entry["outcome"]
            fields["inter_token_seconds"] = tuple(fields["inter_token_seconds"])
            rows.append((RequestOutcome(**fields), entry["finish"]))
        self.spill_path.unlink()
        with self._lock:
            self._pending = rows
            self._blocked = frozenset(o.tenant for o, _ in rows)
        self.retry_pending()  # what still fails stays pending, its tenants blocked, retried in the background


def _suffixed(outcome: RequestOutcome) -> RequestOutcome | None:
    """What to record instead of a row whose request id is taken: a live request's row under a suffixed id, so
    no request goes unbilled; nothing for queued work billed once under its key."""
    if outcome.billing != "row":
        return None
    return dataclasses.replace(outcome, request_id=f"{outcome.request_id}#{uuid.uuid4().hex[:12]}")
