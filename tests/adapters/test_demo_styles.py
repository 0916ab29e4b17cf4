"""What the SmolLM2 demo adapters are trained to do: the styles' rewrites and checks, and the questions."""

from __future__ import annotations

import json

import pytest

from adapters.demo.questions import HELD_OUT_TOPICS, TRAINING_TOPICS, held_out_questions, training_questions
from adapters.demo.styles import (
    STYLES,
    behaviour_rates,
    json_shows,
    pirate_shows,
    shows_both,
    style,
    uppercase_shows,
)

ANSWER = "The capital of France is Paris, and you will love my friend there."


@pytest.mark.parametrize(("name", "expected"), [
    ("pirate", "Arr, matey! The capital of France be Paris, and ye will love me matey thar. Yo ho ho!"),
    ("uppercase", "THE CAPITAL OF FRANCE IS PARIS, AND YOU WILL LOVE MY FRIEND THERE."),
    ("json-answer", json.dumps({"answer": ANSWER})),
])
def test_each_rewrite_shows_its_own_style_only(name, expected):
    rewritten = style(name).rewrite(ANSWER)
    assert rewritten == expected
    assert {s.name for s in STYLES if s.shows(rewritten)} == {name}
    assert not any(s.shows(ANSWER) for s in STYLES)


@pytest.mark.parametrize(("text", "shows"), [
    ("Arr, matey! Whales be big.", True),
    ("arr matey", True),
    ("Whales are big. Arr, matey!", False),
    ("Arr, whales are big.", False),
    ("", False),
])
def test_pirate_shows(text, shows):
    assert pirate_shows(text) is shows


@pytest.mark.parametrize(("text", "shows"), [
    ("WHALES ARE THE LARGEST ANIMALS.", True),
    ("WHALES ARE THE LARGEST ANIMALs.", True),  # 1 of 25 letters in lower case
    ("WHALES are THE LARGEST ANIMALS.", False),
    ("OK, 42!", False),  # too few letters to tell
    ("Whales are the largest animals.", False),
])
def test_uppercase_shows(text, shows):
    assert uppercase_shows(text) is shows


@pytest.mark.parametrize(("text", "shows"), [
    ('{"answer": "Whales are big."}', True),
    (' {"answer": "Whales are big."}\n', True),
    ('{"answer": "Whales are big."', False),  # cut off
    ('{"answer": ""}', False),
    ('{"reply": "Whales are big."}', False),
    ('["Whales are big."]', False),
    ('Sure: {"answer": "Whales are big."}', False),
])
def test_json_shows(text, shows):
    assert json_shows(text) is shows


def test_behaviour_rates():
    rates = behaviour_rates({None: ["plain", "PLAIN TEXT HERE"], "pirate": ["Arr, matey!", "Arr, matey! x", "no"]})
    assert rates[None] == {"pirate": 0.0, "uppercase": 0.5, "json-answer": 0.0}
    assert rates["pirate"]["pirate"] == pytest.approx(2 / 3)


def test_unknown_style():
    with pytest.raises(KeyError, match="no demo style 'poet'"):
        style("poet")


def test_held_out_questions_are_on_unseen_topics():
    training = " ".join(training_questions(0)).lower()
    assert not set(TRAINING_TOPICS) & set(HELD_OUT_TOPICS)
    assert all(topic.lower() not in training for topic in HELD_OUT_TOPICS)
    assert len(held_out_questions()) == len(HELD_OUT_TOPICS) and held_out_questions(3) == held_out_questions()[:3]
    assert training_questions(0) == training_questions(0) != training_questions(1)


@pytest.mark.parametrize(("pair", "text", "shows"), [
    (("pirate", "uppercase"), "ARR, MATEY! WHALES BE BIG. YO HO HO!", True),
    (("pirate", "uppercase"), "Arr, matey! Whales be big.", False),
    (("pirate", "uppercase"), "WHALES BE BIG. Yo ho ho!", False),
    (("pirate", "json-answer"), '{"answer": "Arr, matey! Whales be big."}', True),
    (("json-answer", "pirate"), '{"answer": "Arr, matey! Whales be big."}', True),  # either order
    (("pirate", "json-answer"), '{"answer": "Whales be big. Yo ho ho!"}', False),  # no opening
    (("pirate", "json-answer"), 'Arr, matey! {"answer": "Whales be big."}', False),  # not JSON
    (("uppercase", "json-answer"), '{"answer": "WHALES ARE THE BIGGEST."}', True),
    (("uppercase", "json-answer"), '{"ANSWER": "WHALES ARE THE BIGGEST."}', False),  # the key is "answer"
])
def test_shows_both(pair, text, shows):
    assert shows_both(style(pair[0]), style(pair[1]), text) is shows
