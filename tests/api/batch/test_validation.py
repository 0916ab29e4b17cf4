"""Input files line by line: each problem named with its line number."""

from __future__ import annotations

import json

import pytest

from api.batch.validation import parse_lines

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", url: str = CHAT, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": body or {"model": "m", "messages": [{"role": "user", "content": "hi"}]}})


@pytest.mark.parametrize(("text", "good", "problems"), [
    # file -> custom_ids accepted, (line, code) of the rest
    (f"{line('a')}\n{line('b')}\n", ["a", "b"], []),
    (f"{line('a')}\n\n{line('b')}", ["a", "b"], []),  # blank lines skipped, numbering kept
    (f"{line('a')}\n{{not json\n{line('c')}", ["a", "c"], [(2, "invalid_json_line")]),
    (f"{line('a')}\n[1, 2]", ["a"], [(2, "invalid_json_line")]),
    (f"{line('a')}\n{line('a')}", ["a"], [(2, "duplicate_custom_id")]),
    (f"{line('a', url='/v1/completions')}", [], [(1, "mismatched_endpoint")]),
    ('{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}', [], [(1, "invalid_request")]),
    ('{"method": "POST", "url": "/v1/chat/completions", "body": {}}', [], [(1, "invalid_request")]),
    ("\n \n", [], [(None, "empty_file")]),
    ("\n".join(line(str(i)) for i in range(4)), [], [(None, "too_many_requests")]),
])
def test_parse_lines(text, good, problems):
    lines, errors = parse_lines(text.encode(), CHAT, max_lines=3)
    assert [p.custom_id for p in lines] == good
    assert [(e.line, e.code) for e in errors] == problems


def test_line_numbers_follow_the_file():
    lines, _ = parse_lines(f"\n{line('a')}\n\n{line('b')}".encode(), CHAT, max_lines=10)
    assert [p.line for p in lines] == [2, 4]
