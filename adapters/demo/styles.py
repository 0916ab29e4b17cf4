"""What each SmolLM2 demo adapter does to an answer: the rule that rewrote its training targets, and the check that
tells whether a generated answer shows it. Pure functions; `scripts/train_demo_adapters.py` trains on the rewrites,
the end-to-end tests and the training script's evaluation count the checks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

PIRATE_OPENING = "Arr, matey! "
PIRATE_CLOSING = " Yo ho ho!"
PIRATE_WORDS = {
    "you": "ye", "your": "yer", "yours": "yers", "my": "me", "is": "be", "are": "be", "hello": "ahoy",
    "hi": "ahoy", "friend": "matey", "friends": "mateys", "yes": "aye", "there": "thar", "for": "fer",
}
_WORD = re.compile(r"[A-Za-z]+")
# The least share of upper-case letters among an answer's letters, and the fewest letters, to count as shouting.
UPPER_SHARE = 0.9
UPPER_MIN_LETTERS = 8


def pirate_rewrite(answer: str) -> str:
    """Pirate words for a few common ones (keeping a capital), opened with "Arr, matey!" and closed "Yo ho ho!"."""
    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        pirate = PIRATE_WORDS.get(word.lower())
        if pirate is None:
            return word
        return pirate.capitalize() if word[0].isupper() else pirate

    return PIRATE_OPENING + _WORD.sub(swap, answer) + PIRATE_CLOSING


def pirate_shows(text: str) -> bool:
    """Opens with "Arr" and says "matey"."""
    lowered = text.strip().lower()
    return lowered.startswith("arr") and "matey" in lowered


def uppercase_rewrite(answer: str) -> str:
    return answer.upper()


def uppercase_shows(text: str) -> bool:
    """At least UPPER_MIN_LETTERS letters, and UPPER_SHARE of the cased ones upper case."""
    cased = [c for c in text if c.isalpha() and c.lower() != c.upper()]
    return len(cased) >= UPPER_MIN_LETTERS and sum(c.isupper() for c in cased) >= UPPER_SHARE * len(cased)


def json_rewrite(answer: str) -> str:
    return json.dumps({"answer": answer}, ensure_ascii=False)


def json_shows(text: str) -> bool:
    """The whole answer is a JSON object whose "answer" is a non-empty string."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and isinstance(value.get("answer"), str) and bool(value["answer"].strip())


JSON_ANSWER = "json-answer"


@dataclass(frozen=True)
class Style:
    """One demo adapter's behaviour. `name` is the adapter's name in the registry."""

    name: str
    summary: str
    rewrite: Callable[[str], str]
    shows: Callable[[str], bool]


STYLES: tuple[Style, ...] = (
    Style("pirate", 'answers in pirate speak, opening with "Arr, matey!"', pirate_rewrite, pirate_shows),
    Style("uppercase", "answers in UPPER CASE", uppercase_rewrite, uppercase_shows),
    Style(JSON_ANSWER, 'answers as a JSON object {"answer": "..."}', json_rewrite, json_shows),
)


def style(name: str) -> Style:
    for candidate in STYLES:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no demo style {name!r} (known: {', '.join(s.name for s in STYLES)})")


def shows_within(style: Style, text: str) -> bool:
    """Whether `text` shows `style`. JSON is a container: in a JSON answer, any style but json-answer is looked for
    in the text it wraps (pirate speak inside {"answer": ...}), not in the braces around it."""
    if style.name != JSON_ANSWER and json_shows(text):
        return style.shows(json.loads(text)["answer"])
    return style.shows(text)


def shows_both(first: Style, second: Style, text: str) -> bool:
    return shows_within(first, text) and shows_within(second, text)


def behaviour_rates(answers: dict[str | None, list[str]]) -> dict[str | None, dict[str, float]]:
    """For each model's answers (None: the base model), the share of them that shows each style."""
    return {model: {s.name: sum(map(s.shows, texts)) / len(texts) if texts else 0.0 for s in STYLES}
            for model, texts in answers.items()}
