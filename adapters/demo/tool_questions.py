"""Prompts for training and checking the SmolLM2 demo's tool-calling adapter (`tool-caller`): three demo tools, the
questions that fit one of them and the calls they expect, and questions that fit none. The held-out questions use
cities, amounts and phrasings no training question uses. Pure.

A call is written in the hermes format the demo's chat template shows the model (adapters/demo/smollm2_tools.jinja)
and `--tool-call-parser hermes` reads: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

ADAPTER = "tool-caller"


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


WEATHER = _function("get_weather", "Get the current weather in a city.", {"city": {"type": "string"}})
TIME = _function("get_time", "Get the current local time in a city.", {"city": {"type": "string"}})
CURRENCY = _function("convert_currency", "Convert an amount of money from one currency to another.", {
    "amount": {"type": "number"}, "from_currency": {"type": "string", "description": "ISO 4217 code"},
    "to_currency": {"type": "string", "description": "ISO 4217 code"}})
TOOLS = [WEATHER, TIME, CURRENCY]

TRAINING_CITIES = (
    "Paris", "London", "Tokyo", "New York", "Berlin", "Madrid", "Rome", "Cairo", "Sydney", "Toronto", "Mumbai",
    "Beijing", "Moscow", "Istanbul", "Chicago", "Seoul", "Bangkok", "Dubai", "Amsterdam", "Vienna", "Prague",
    "Athens", "Dublin", "Oslo", "Stockholm", "Helsinki", "Warsaw", "Lisbon", "Nairobi", "Lagos", "Lima", "Bogota",
    "Santiago", "Havana", "Boston", "Denver", "Seattle", "Miami", "Hanoi", "Manila",
)
HELD_OUT_CITIES = ("Kyoto", "Zurich", "Buenos Aires", "Marseille", "Vancouver", "Casablanca", "Edinburgh", "Osaka",
                   "Melbourne", "Reykjavik")
CURRENCIES = {"dollars": "USD", "euros": "EUR", "yen": "JPY", "pounds": "GBP", "Swiss francs": "CHF",
              "Canadian dollars": "CAD", "rupees": "INR", "pesos": "MXN"}
TRAINING_AMOUNTS = (5, 10, 20, 25, 50, 75, 100, 150, 200, 250, 500, 1000)
HELD_OUT_AMOUNTS = (30, 60, 120, 300, 800)

PHRASINGS = {  # tool: (training phrasings, held-out phrasings)
    "get_weather": (("What's the weather in {city}?", "Is it raining in {city} right now?",
                     "How warm is it in {city} today?", "What is the weather like in {city}?"),
                    ("Tell me the current weather in {city}.", "Do I need an umbrella in {city} today?")),
    "get_time": (("What time is it in {city}?", "What's the local time in {city}?",
                  "Tell me the current time in {city}."),
                 ("What is the time right now in {city}?", "Is it late in {city} right now?")),
    "convert_currency": (("How much is {amount} {source} in {target}?", "Convert {amount} {source} to {target}.",
                          "What are {amount} {source} in {target}?"),
                         ("I have {amount} {source}. How many {target} is that?",
                          "Change {amount} {source} into {target}, please.")),
}


@dataclass(frozen=True)
class ToolCase:
    """A question, the tools offered with it, and the call it should get (None: it should get text)."""

    question: str
    tools: list[dict[str, Any]]
    call: tuple[str, dict[str, Any]] | None

    def target(self) -> str | None:
        """The call in the hermes format (None for a text case)."""
        if self.call is None:
            return None
        name, arguments = self.call
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _calls(rng: random.Random, phrasings: int, cities: tuple[str, ...], amounts: tuple[int, ...],
           count: int) -> list[ToolCase]:
    """`count` questions per tool from its phrasings (index `phrasings` of PHRASINGS: 0 training, 1 held out)."""
    cases = []
    names = list(CURRENCIES)
    for i in range(count):
        for tool in ("get_weather", "get_time"):
            city = cities[(i + (tool == "get_time") * 3) % len(cities)]
            template = PHRASINGS[tool][phrasings][i % len(PHRASINGS[tool][phrasings])]
            cases.append(ToolCase(template.format(city=city), TOOLS, (tool, {"city": city})))
        source, target = rng.sample(names, 2)
        amount = amounts[i % len(amounts)]
        template = PHRASINGS["convert_currency"][phrasings][i % len(PHRASINGS["convert_currency"][phrasings])]
        cases.append(ToolCase(template.format(amount=amount, source=source, target=target), TOOLS,
                              ("convert_currency", {"amount": amount, "from_currency": CURRENCIES[source],
                                                    "to_currency": CURRENCIES[target]})))
    return cases


def _unfit(cases: list[ToolCase]) -> list[ToolCase]:
    """The same questions with their tool left out of the offer: no tool fits, so text."""
    return [ToolCase(c.question, [t for t in TOOLS if t["function"]["name"] != c.call[0]], None) for c in cases]


def training_cases(seed: int, general: list[str]) -> list[ToolCase]:
    """Calls (40 questions per tool), 30 questions whose tool is not offered, and the `general` questions (which
    no tool fits) with every tool offered; shuffled by `seed`."""
    rng = random.Random(seed)
    calls = _calls(rng, 0, TRAINING_CITIES, TRAINING_AMOUNTS, 40)
    cases = calls + _unfit(rng.sample(calls, 30)) + [ToolCase(q, TOOLS, None) for q in general]
    rng.shuffle(cases)
    return cases


def held_out_cases(general: list[str]) -> list[ToolCase]:
    """10 calls per tool on held-out cities, amounts and phrasings; 10 of them with their tool not offered; and the
    `general` held-out questions with every tool offered."""
    calls = _calls(random.Random(1), 1, HELD_OUT_CITIES, HELD_OUT_AMOUNTS, 10)
    return calls + _unfit(calls[::3]) + [ToolCase(q, TOOLS, None) for q in general]


Calls = list[tuple[str, dict[str, Any]]]  # a reply's calls, as the server's parser found them: (name, arguments)


def tool_call_rates(cases: list[ToolCase], replies: list[Calls]) -> dict[str, float]:
    """`right_calls`: share of the questions a tool fits answered by exactly the expected call (name and
    arguments); `valid_calls`: by calls (the parser keeps only those that parse and name an offered tool);
    `spurious_calls`: share of the questions no tool fits answered by any call."""
    fit = [(c, calls) for c, calls in zip(cases, replies, strict=True) if c.call is not None]
    unfit = [calls for c, calls in zip(cases, replies, strict=True) if c.call is None]
    return {
        "right_calls": sum(calls == [c.call] for c, calls in fit) / max(len(fit), 1),
        "valid_calls": sum(bool(calls) for _, calls in fit) / max(len(fit), 1),
        "spurious_calls": sum(bool(calls) for calls in unfit) / max(len(unfit), 1),
    }


def unfit_call_text(cases: list[ToolCase], texts: list[str]) -> float:
    """Share of the questions no tool fits whose reply text holds a `<tool_call>` block anyway (one naming a tool
    that is not offered: the parser leaves it in the text, so it is no call, but the user sees it)."""
    unfit = [text for c, text in zip(cases, texts, strict=True) if c.call is None]
    return sum("<tool_call>" in text for text in unfit) / max(len(unfit), 1)
