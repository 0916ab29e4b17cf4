"""LangChain's `ChatOpenAI` against the real server, as a new user writes it: structured output by JSON schema and
tools bound with a forced choice, on adapters (the random tiny model answers in whatever the constraint allows)."""

from __future__ import annotations

from typing import Literal

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field


class Verdict(BaseModel):
    answer: Literal["yes", "no", "maybe"]
    score: int = Field(ge=0, le=9)


class Weather(BaseModel):
    """The weather in a city."""

    city: Literal["paris", "tokyo", "lima"]
    unit: Literal["c", "f"]


@pytest.fixture
def chat(server, keys):
    def make(model: str) -> ChatOpenAI:
        return ChatOpenAI(base_url=f"{server}/v1", api_key=keys.tenants["acme"], model=model, temperature=0,
                          max_tokens=64, max_retries=0, timeout=120)

    return make


@pytest.mark.parametrize("model_index", [0, 2])
def test_with_structured_output_json_schema(chat, adapter_names, model_index):
    verdict = chat(adapter_names[model_index]).with_structured_output(Verdict, method="json_schema").invoke(
        "is this good?")
    assert isinstance(verdict, Verdict)


@pytest.mark.parametrize("tool_choice", ["Weather", "any"])
def test_bind_tools_with_a_forced_choice(chat, adapter_names, tool_choice):
    bound = chat(adapter_names[1]).bind_tools([Weather], tool_choice=tool_choice, parallel_tool_calls=False)
    message = bound.invoke("what is the weather in paris?")
    call, = message.tool_calls
    assert call["name"] == "Weather"
    Weather.model_validate(call["args"])


def test_bind_tools_with_auto_is_refused_by_name(chat, adapter_names):
    import openai

    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        chat(adapter_names[1]).bind_tools([Weather]).invoke("what is the weather in paris?")
