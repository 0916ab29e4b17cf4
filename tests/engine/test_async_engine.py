from __future__ import annotations

from engine.async_engine import _Waiting


def test_a_request_waits_from_submission_to_its_first_output():
    by_adapter: dict[str, int] = {}
    first, second, base = _Waiting(by_adapter, "poet#1"), _Waiting(by_adapter, "poet#1"), _Waiting(by_adapter, None)
    assert by_adapter == {"poet#1": 2}  # base-model requests are not per-adapter queueing
    first.over()
    first.over()  # every later output, and the end of the stream, call it again
    base.over()
    assert by_adapter == {"poet#1": 1}
    second.over()  # e.g. aborted before any output
    assert by_adapter == {}
