from __future__ import annotations

import json

import pytest

from adapters.demo.questions import held_out_questions, training_questions
from adapters.demo.tool_questions import (
    HELD_OUT_CITIES,
    TRAINING_CITIES,
    ToolCase,
    held_out_cases,
    tool_call_rates,
    training_cases,
    unfit_call_text,
)
from api.openai.tool_parser import parse_hermes

TRAINING = training_cases(0, training_questions(0))
HELD_OUT = held_out_cases(held_out_questions())


def test_held_out_questions_are_not_trained_on():
    assert not {c.question for c in HELD_OUT} & {c.question for c in TRAINING}
    assert not set(HELD_OUT_CITIES) & set(TRAINING_CITIES)


@pytest.mark.parametrize("cases", [TRAINING, HELD_OUT])
def test_every_call_is_what_the_servers_parser_reads_and_its_tool_is_offered(cases):
    for case in cases:
        names = frozenset(t["function"]["name"] for t in case.tools)
        if case.call is None:
            continue
        [call] = parse_hermes(case.target(), names).calls
        assert (call.function.name, json.loads(call.function.arguments)) == case.call


def test_a_question_whose_tool_is_not_offered_wants_text():
    unfit = [c for c in HELD_OUT if c.call is None and len(c.tools) == 2]
    assert len(unfit) == 10 and all(c.target() is None for c in unfit)


WEATHER = ToolCase("w?", [], ("get_weather", {"city": "Oslo"}))
TEXT = ToolCase("hi", [], None)


@pytest.mark.parametrize("cases,calls,rates", [
    ([WEATHER, TEXT], [[("get_weather", {"city": "Oslo"})], []], (1.0, 1.0, 0.0)),
    ([WEATHER, TEXT], [[("get_weather", {"city": "oslo"})], [("get_time", {})]], (0.0, 1.0, 1.0)),
    ([WEATHER, WEATHER], [[], [("get_weather", {"city": "Oslo"}), ("get_time", {"city": "Oslo"})]], (0.0, 0.5, 0.0)),
])
def test_tool_call_rates(cases, calls, rates):
    got = tool_call_rates(cases, calls)
    assert (got["right_calls"], got["valid_calls"], got["spurious_calls"]) == rates


@pytest.mark.parametrize("texts,share", [
    (["calling", "plain"], 0.0),
    (["calling", '<tool_call>{"name": "get_time"}</tool_call>'], 1.0),
])
def test_unfit_call_text_counts_call_blocks_where_no_tool_fits(texts, share):
    assert unfit_call_text([WEATHER, TEXT], texts) == share
