"""The embedded default on a real architecture: SmolLM2-135M-Instruct (GQA, tied embeddings, 30 layers) and its
trained adapters, through a real server and the real openai client.

Greedy float32 outputs equal transformers + peft token for token, each model alone and all five in one batch; and
each adapter does what it was trained to do on held-out questions, the base model never."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field

from adapters.demo.questions import held_out_questions
from adapters.demo.smollm2 import MODEL_ID, TRAINED_ADAPTERS
from adapters.demo.styles import STYLES, behaviour_rates, shows_both, style
from tests.engine_gate import EngineGate, until_engine_holds

QUESTIONS = ["What is the capital of France?", "Describe whales in one sentence."]
MAX_TOKENS = 16
BEHAVIOUR_TOKENS = 64
# The least share of held-out answers in which an adapter's style shows (the issue asks for 80%).
MIN_RATE = 0.8
# The README's mixture, named per request: upper case inside a JSON answer in 10 of the 20 held-out answers with
# transformers + peft (scripts/demo_mixture.py --pair uppercase,json-answer, 48 tokens).
MIXTURE, MIXTURE_TOKENS, MIN_MIXTURE_RATE = "uppercase*0.75+json-answer*1.5", 48, 0.4
# The tool-caller on held-out tool questions (adapters/demo/trained/EVALUATION.json: 57% right, 83% valid, 0%
# spurious): bounds a little below what it measured, for a CPU whose rounding flips a greedy choice or two.
MIN_RIGHT_CALLS = 0.5
MIN_VALID_CALLS = 0.75
MAX_SPURIOUS = 0.1


def _models() -> list[tuple[str, str | None]]:
    return [(MODEL_ID, None)] + [(name, name) for name in TRAINED_ADAPTERS]


def _prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _params(model: str, ids: list[int]) -> dict:
    return {"model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0,
            "extra_body": {"ignore_eos": True, "return_token_ids": True}}


@pytest.fixture(scope="module")
def client(smollm2_server) -> OpenAI:
    return OpenAI(base_url=f"{smollm2_server}/v1", api_key="unused", max_retries=0, timeout=300)


def test_lists_the_base_model_and_its_adapters(client):
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL_ID, *TRAINED_ADAPTERS}
    assert all(models[name].model_extra["parent"] == MODEL_ID for name in TRAINED_ADAPTERS)


def test_adapters_change_outputs(smollm2_reference, smollm2_tokenizer):
    """Guards the tests below: an adapter equal to the base model would hide leakage."""
    ids = _prompt(smollm2_tokenizer, QUESTIONS[0])
    outputs = {name: tuple(smollm2_reference.greedy(adapter, ids, MAX_TOKENS)) for name, adapter in _models()}
    assert len(set(outputs.values())) == len(outputs), outputs


def test_each_model_alone_matches_hf(client, smollm2_reference, smollm2_tokenizer):
    for model, adapter in _models():
        for question in QUESTIONS:
            ids = _prompt(smollm2_tokenizer, question)
            response = client.completions.create(**_params(model, ids))
            assert response.model == (model if adapter is None else f"{model}@1")
            tokens = response.choices[0].model_extra["token_ids"]
            assert tokens == smollm2_reference.greedy(adapter, ids, MAX_TOKENS), (model, question)


async def _streamed_tokens(client: AsyncOpenAI, params: dict) -> list[int]:
    tokens = []
    async for chunk in await client.completions.create(stream=True, **params):
        for choice in chunk.choices:
            tokens.extend((choice.model_extra or {}).get("token_ids") or [])
    return tokens


async def test_mixed_batch_matches_hf(smollm2_server, smollm2_process, smollm2_reference, smollm2_tokenizer):
    """The base model and all four adapters in flight together, twice over each question: all of them reach the
    held engine before it runs a step, so the batch is mixed by construction."""
    jobs = [(model, adapter, _prompt(smollm2_tokenizer, q)) for model, adapter in _models() * 2 for q in QUESTIONS]
    async with AsyncOpenAI(base_url=f"{smollm2_server}/v1", api_key="unused", max_retries=0, timeout=300) as client, \
            httpx.AsyncClient(base_url=smollm2_server, timeout=60) as plain:
        for model, adapter in _models():  # every adapter in its engine slot first: a held engine loads none
            if adapter is not None:
                await client.completions.create(**{**_params(model, jobs[0][2]), "max_tokens": 1})
        with EngineGate.of(smollm2_process.proc.pid):
            streams = [asyncio.create_task(_streamed_tokens(client, _params(model, ids))) for model, _, ids in jobs]
            await until_engine_holds(plain, len(jobs))
        results = await asyncio.gather(*streams)
    for (model, adapter, ids), tokens in zip(jobs, results):
        assert tokens == smollm2_reference.greedy(adapter, ids, MAX_TOKENS), model


async def test_each_adapter_shows_its_style_on_held_out_questions(smollm2_server):
    """Chat through the openai client, greedy: each adapter's style in at least MIN_RATE of the answers to questions
    on topics it was not trained on, the base model's answers in none of the styles."""
    questions = held_out_questions()

    async def answer(client: AsyncOpenAI, model: str, question: str) -> str:
        response = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=BEHAVIOUR_TOKENS, temperature=0)
        return response.choices[0].message.content

    async with AsyncOpenAI(base_url=f"{smollm2_server}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        models = [None, *(s.name for s in STYLES)]
        texts = await asyncio.gather(*[answer(client, m or MODEL_ID, q) for m in models for q in questions])
    answers = {m: texts[i * len(questions):(i + 1) * len(questions)] for i, m in enumerate(models)}
    rates = behaviour_rates(answers)
    assert all(rate == 0 for rate in rates[None].values()), (rates[None], answers[None])
    for style in STYLES:
        assert rates[style.name][style.name] >= MIN_RATE, (style.name, rates[style.name], answers[style.name])


async def test_the_readmes_mixture_shows_both_styles(smollm2_server):
    questions = held_out_questions()
    async with AsyncOpenAI(base_url=f"{smollm2_server}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        responses = await asyncio.gather(*[client.chat.completions.create(
            model=MIXTURE, messages=[{"role": "user", "content": q}], max_tokens=MIXTURE_TOKENS, temperature=0)
            for q in questions])
    texts = [r.choices[0].message.content for r in responses]
    both = [t for t in texts if shows_both(style("uppercase"), style("json-answer"), t)]
    assert len(both) >= MIN_MIXTURE_RATE * len(texts), texts


class Capital(BaseModel):
    city: str = Field(max_length=40)
    country: str = Field(max_length=40)


@pytest.mark.parametrize("model", [MODEL_ID, *TRAINED_ADAPTERS])
def test_structured_outputs_on_a_real_model(client, model):
    """What a 2026 client does: `parse` with a pydantic model, and a JSON-object answer, on the base model and on
    each adapter."""
    question = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    parsed = client.chat.completions.parse(model=model, messages=question, response_format=Capital, max_tokens=128,
                                           temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, Capital)
    answer = client.chat.completions.create(model=model, messages=question, max_tokens=160, temperature=0,
                                            response_format={"type": "json_object"})
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


# ------------------------------------------------------------------ tools: the demo's template and `auto` parser

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "?"}],
])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_tool_template_renders_as_smollm2s_own_without_tools(smollm2_tokenizer, messages, add_generation_prompt):
    from adapters.demo.assets import SMOLLM2_TOOL_TEMPLATE

    own = smollm2_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    ours = smollm2_tokenizer.apply_chat_template(messages, tokenize=False, chat_template=SMOLLM2_TOOL_TEMPLATE.read_text(),
                                                 add_generation_prompt=add_generation_prompt)
    assert ours == own


def test_the_server_renders_tools_calls_and_results_with_the_demo_template(smollm2_server, smollm2_tokenizer):
    from adapters.demo.assets import SMOLLM2_TOOL_TEMPLATE

    messages = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None,
                                                                   "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    served = httpx.post(f"{smollm2_server}/tokenize", json={"model": MODEL_ID, "messages": messages, "tools": TOOLS},
                        timeout=60).json()["tokens"]
    text = smollm2_tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True,
                                                 chat_template=SMOLLM2_TOOL_TEMPLATE.read_text())
    assert served == smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert "<tools>" in text and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text


@pytest.mark.parametrize("model", [MODEL_ID, "json-answer"])
async def test_the_agents_sdk_completes_a_tool_round_trip(smollm2_server, model):
    """The OpenAI Agents SDK's default model class (the Responses API): a required call, the tool's output sent
    back, and the answer under `auto` (the SDK resets tool_choice after a call), which the parser reads as text."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"It is sunny in {city}."

    client = AsyncOpenAI(base_url=f"{smollm2_server}/v1", api_key="unused", max_retries=0, timeout=300)
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64))
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
    assert len(cities) == 1 and cities[0]
    assert [type(item).__name__ for item in result.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                  "MessageOutputItem"]
    assert isinstance(result.final_output, str) and result.final_output


async def test_the_tool_caller_calls_a_fitting_tool_and_otherwise_answers_in_text(smollm2_server):
    """`auto` on the held-out tool questions (cities, amounts and phrasings it was not trained on): the tool-caller
    makes the expected call where a tool fits and none where none does; the base model makes none."""
    from adapters.demo.tool_questions import ADAPTER, held_out_cases, tool_call_rates

    cases = held_out_cases(held_out_questions())

    gate = asyncio.Semaphore(32)  # within the server's admission queue

    async def calls(client: AsyncOpenAI, model: str, case) -> list[tuple[str, dict]]:
        async with gate:
            response = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": case.question}], tools=case.tools,
                max_tokens=BEHAVIOUR_TOKENS, temperature=0)
        message = response.choices[0].message
        assert (response.choices[0].finish_reason == "tool_calls") == bool(message.tool_calls)
        return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]

    async with AsyncOpenAI(base_url=f"{smollm2_server}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        fit = [c for c in cases if c.call is not None]  # the base model only where a call would be right
        replies = await asyncio.gather(*[calls(client, ADAPTER, c) for c in cases],
                                       *[calls(client, MODEL_ID, c) for c in fit])
    adapter, base = tool_call_rates(cases, replies[:len(cases)]), tool_call_rates(fit, replies[len(cases):])
    assert adapter["right_calls"] >= MIN_RIGHT_CALLS and adapter["valid_calls"] >= MIN_VALID_CALLS, adapter
    assert adapter["spurious_calls"] <= MAX_SPURIOUS, adapter
    assert base["valid_calls"] == 0, base
