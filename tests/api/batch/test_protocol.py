"""Completion windows and the output and error file lines."""

from __future__ import annotations

import json

import pytest

from api.batch.lines import output_line
from api.batch.protocol import window_seconds


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400), ("90s", 90), ("30m", 1800), ("168h", 604800)])
def test_window_seconds(window, seconds):
    assert window_seconds(window) == seconds


@pytest.mark.parametrize("window", ["", "24", "0h", "1d", "169h", "-1h", "1.5h", " 24h"])
def test_bad_windows(window):
    with pytest.raises(ValueError):
        window_seconds(window)


@pytest.mark.parametrize(("state", "status", "response", "error"), [
    ("done", 200, {"status_code": 200, "request_id": "r", "body": {"id": "x"}}, None),
    ("failed", 400, {"status_code": 400, "request_id": "r", "body": {"id": "x"}}, None),
    ("cancelled", None, None, "batch_cancelled"),
    ("expired", None, None, "batch_expired"),
])
def test_output_line(state, status, response, error):
    row = {"line": 3, "custom_id": "c3", "state": state, "status": status, "request_id": "r",
           "response": json.dumps({"id": "x"}) if status else None}
    line = json.loads(output_line("batch_1", row))
    assert line["custom_id"] == "c3" and line["id"].startswith("batch_req_") and line["response"] == response
    assert (line["error"] or {}).get("code") == error
    assert output_line("batch_1", row) == output_line("batch_1", row)  # stable: a resumed finalize writes the same
