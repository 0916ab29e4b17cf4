"""One JSON line per finished request on the `loraplex.requests` logger, and a formatter that keeps it pure JSON."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from api.observability.outcome import RequestOutcome

REQUEST_LOGGER = "loraplex.requests"
# LogRecord attribute carrying the structured fields, set through `extra=`.
FIELDS_ATTR = "json_fields"


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def request_log_record(outcome: RequestOutcome, finish: str | None) -> dict[str, Any]:
    """The fields of one request's log line; `finish` is the finish reason ("stop", "length", "abort", ...)."""
    return {
        "timestamp": _iso(outcome.finished_at),
        "request_id": outcome.request_id,
        "tenant": outcome.tenant,
        "priority": outcome.priority,
        "model": outcome.model_version,
        "status": outcome.status,
        "finish": finish,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "queue_s": _seconds(outcome.queue_seconds),
        "ttft_s": _seconds(outcome.ttft_seconds),
        "tpot_s": _seconds(outcome.tpot_seconds),
        "e2e_s": _seconds(outcome.e2e_seconds),
        "price_usd": outcome.price_usd,
        "cost_usd": outcome.cost_usd,
    }


def log_request(outcome: RequestOutcome, finish: str | None, logger: logging.Logger | None = None) -> None:
    """The message is the JSON itself, so any formatter prints it; `JsonFormatter` prints nothing else."""
    fields = request_log_record(outcome, finish)
    (logger or logging.getLogger(REQUEST_LOGGER)).info(
        json.dumps(fields, separators=(",", ":")), extra={FIELDS_ATTR: fields}
    )


class JsonFormatter(logging.Formatter):
    """A record with structured fields becomes exactly those fields; any other record becomes
    {timestamp, level, logger, message[, exception]}. One line either way."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, FIELDS_ATTR, None)
        if fields is None:
            fields = {"timestamp": _iso(record.created), "level": record.levelname, "logger": record.name,
                      "message": record.getMessage()}
            if record.exc_info:
                fields["exception"] = self.formatException(record.exc_info)
        return json.dumps(fields, separators=(",", ":"), default=str)
