from __future__ import annotations

import json

import pytest

from api.openai.tool_parser import StreamedReply, parse_hermes

NAMES = frozenset({"weather", "clock"})
WEATHER = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CLOCK = '<tool_call>{"name": "clock"}</tool_call>'


@pytest.mark.parametrize("text,content,calls", [
    ("It is sunny.", "It is sunny.", []),
    (WEATHER, None, [("weather", {"city": "Paris"})]),
    ("Let me look.\n" + WEATHER, "Let me look.", [("weather", {"city": "Paris"})]),
    (WEATHER + "\n" + CLOCK + "\n", None, [("weather", {"city": "Paris"}), ("clock", {})]),
    # not calls: the whole text stays content
    ('<tool_call>{"name": "unknown", "arguments": {}}</tool_call>', None, None),
    ('<tool_call>{"name": "weather", "arguments": {"city": "Pa', None, None),  # cut short
    ('<tool_call>{"name": "weather", "arguments": "Paris"}</tool_call>', None, None),
    ("<tool_call>not json</tool_call>", None, None),
    (WEATHER + " and some words after", None, None),
])
def test_parse_hermes(text, content, calls):
    parsed = parse_hermes(text, NAMES)
    if calls is None:
        assert (parsed.content, parsed.calls) == (text, [])
        return
    assert parsed.content == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed.calls] == calls
    assert len({c.id for c in parsed.calls}) == len(calls)


def _stream(pieces: list[str]) -> tuple[list[str], str, list]:
    reply = StreamedReply(NAMES)
    sent = [reply.feed(p) for p in pieces]
    rest, calls = reply.finish()
    return sent, rest, calls


@pytest.mark.parametrize("pieces,sent,rest,names", [
    (["Hel", "lo", "."], ["Hel", "lo", "."], "", []),
    # a `<` that may open a call is held until it cannot
    (["a <", "b"], ["a ", "<b"], "", []),
    (["a <tool", "_ca"], ["a ", ""], "<tool_ca", []),
    (["Look.", "<tool_", "call>", WEATHER[len("<tool_call>"):]], ["Look.", "", "", ""], "", ["weather"]),
    # held text that is no call goes out at the end
    (["<tool_call>", "oops"], ["", ""], "<tool_call>oops", []),
])
def test_streamed_reply(pieces, sent, rest, names):
    got_sent, got_rest, calls = _stream(pieces)
    assert (got_sent, got_rest, [c.function.name for c in calls]) == (sent, rest, names)


@pytest.mark.parametrize("text", ["plain answer", "x " + WEATHER, WEATHER + CLOCK, "<tool_call>{bad", "a < b <tool"])
def test_a_stream_split_anywhere_says_what_the_whole_text_says(text):
    whole = parse_hermes(text, NAMES)
    for cut in range(len(text) + 1):
        sent, rest, calls = _stream([text[:cut], text[cut:]])
        assert [c.function.name for c in calls] == [c.function.name for c in whole.calls]
        assert "".join(sent) + rest == (text if not whole.calls else "".join(sent))
