from __future__ import annotations

import io
import json
import logging

import pytest

from api.observability.requestlog import REQUEST_LOGGER, JsonFormatter, log_request, request_log_record


def test_request_log_record(outcome):
    record = request_log_record(outcome(model="support", version="3", finished_at=0.25, e2e_seconds=0.6,
                                        ttft_seconds=0.2, completion_tokens=5), "stop")
    assert record == {
        "timestamp": "1970-01-01T00:00:00.250Z",
        "request_id": "req-1",
        "tenant": "acme",
        "priority": "normal",
        "model": "support@3",
        "status": 200,
        "finish": "stop",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "queue_s": 0.01,
        "ttft_s": 0.2,
        "tpot_s": 0.1,
        "e2e_s": 0.6,
        "price_usd": 0.002,
        "cost_usd": 0.001,
    }


@pytest.mark.parametrize("changes, field, expected", [
    ({"completion_tokens": 1}, "tpot_s", None),
    ({"ttft_seconds": None}, "ttft_s", None),
    ({"version": ""}, "model", "base"),
    ({"status": 499}, "status", 499),
    ({"queue_seconds": 0.1234567891}, "queue_s", 0.123457),
])
def test_request_log_record_fields(outcome, changes, field, expected):
    assert request_log_record(outcome(**changes), None)[field] == expected


@pytest.fixture
def captured():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(REQUEST_LOGGER)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_log_request_writes_one_json_line(outcome, captured):
    log_request(outcome(request_id="abc"), "length")
    lines = captured.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == request_log_record(outcome(request_id="abc"), "length")


def test_log_request_message_is_json_under_any_formatter(outcome):
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("test.requestlog.plain")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    log_request(outcome(), "stop", logger=logger)
    assert json.loads(records[0].getMessage())["finish"] == "stop"


def test_json_formatter_plain_record():
    record = logging.LogRecord("loraplex.engine", logging.WARNING, __file__, 1, "slot %d busy", (3,), None)
    record.created = 0.0
    assert json.loads(JsonFormatter().format(record)) == {
        "timestamp": "1970-01-01T00:00:00.000Z", "level": "WARNING", "logger": "loraplex.engine",
        "message": "slot 3 busy",
    }


def test_json_formatter_keeps_exceptions_on_one_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert "RuntimeError: boom" in json.loads(line)["exception"]
