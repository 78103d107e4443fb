"""Constrained decoding on the real default model: what comes out matches the grammar.

Greedy (or seeded) generation from Gemma 3 270M under each constraint of
``server/prepare/constraints.py``; the tests check the shape of the output (JSON that
parses, matches its schema, a tool-call block the parser reads), never the
model's exact text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import llguidance
import pytest

from sluicegate.core.decoding.toolcalls import ToolCallParser
from sluicegate.core.errors import EngineError
from sluicegate.core.events import EngineOutput, FinishReason, ToolCallFragment
from sluicegate.engines.base import GenerateRequest, Grammar, SamplingParams
from sluicegate.engines.llamacpp.engine import LlamaCppEngine
from sluicegate.model import default_model_path
from sluicegate.server.prepare.constraints import grammar_for

pytestmark = [pytest.mark.llamacpp, pytest.mark.anyio]

# Bounded, so that the grammar itself ends every output well within max_tokens.
ANIMAL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "legs": {"type": "integer", "minimum": 0, "maximum": 1000},
        "sounds": {
            "type": "array",
            "items": {"type": "string", "maxLength": 20},
            "maxItems": 3,
        },
    },
    "required": ["name", "legs", "sounds"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}  # no parameters


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        default_model_path(), n_ctx=4096, n_parallel=4, step_tokens=128, queue_limit=8
    )
    yield eng
    asyncio.run(eng.aclose())


def chat(engine: LlamaCppEngine, user: str) -> tuple[int, ...]:
    text = f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"
    return tuple(engine.tokenizer.encode(text, add_special=True, parse_special=True))


async def generate(
    engine: LlamaCppEngine, rid: str, user: str, grammar: Grammar | None, **params: Any
) -> tuple[str, list[EngineOutput]]:
    sampling = SamplingParams(
        **{"max_tokens": 96, "temperature": 0.0, "grammar": grammar, **params}
    )
    outputs = [
        out
        async for out in engine.generate(
            GenerateRequest(rid, chat(engine, user), sampling)
        )
    ]
    pieces = engine.tokenizer.pieces
    special = engine.tokenizer.special_ids
    ids = [t for o in outputs for t in o.token_ids if t not in special]
    return b"".join(pieces[t] for t in ids).decode("utf-8"), outputs


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def check_schema(value: Any, schema: dict[str, Any]) -> None:
    """Assert ``value`` matches ``schema`` (the keywords these tests use, by hand:
    the suite does not depend on a JSON-schema library)."""
    kind = schema.get("type")
    if kind is not None:
        assert isinstance(value, _TYPES[kind]), (value, kind)
        assert kind in ("boolean",) or not isinstance(value, bool), (value, kind)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        assert set(schema.get("required", ())) <= set(value), (value, schema)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(properties), (value, schema)
        for key, item in value.items():
            if key in properties:
                check_schema(item, properties[key])
    if isinstance(value, list) and "items" in schema:
        for item in value:
            check_schema(item, schema["items"])


def calls_of(text: str, names: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """(content, [(name, arguments)]) as the tool-call parser reads ``text``."""
    parser = ToolCallParser(names)
    parts = [*parser.feed(text), *parser.flush()]
    content = "".join(p for p in parts if isinstance(p, str))
    calls: dict[int, list[str]] = {}
    for part in parts:
        if isinstance(part, ToolCallFragment):
            entry = calls.setdefault(part.index, ["", ""])
            entry[0] += part.name or ""
            entry[1] += part.arguments
    return content, [(name, args) for name, args in calls.values()]


async def test_json_object_output_is_one_json_object(engine: LlamaCppEngine) -> None:
    grammar = grammar_for(response_format={"type": "json_object"})
    text, outputs = await generate(engine, "jo", "Describe a cat.", grammar)
    assert outputs[-1].finish_reason is FinishReason.STOP  # the grammar ended it
    assert isinstance(json.loads(text), dict)


async def test_json_schema_output_matches_the_schema(engine: LlamaCppEngine) -> None:
    grammar = grammar_for(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "animal", "schema": ANIMAL, "strict": True},
        }
    )
    variants: list[dict[str, Any]] = [
        {},
        {"temperature": 0.8, "seed": 7},
        {"logprobs": 2},  # masks every step
        {"repetition_penalty": 1.3},  # masks every step
    ]
    # All variants at once: the engine decodes them in the same steps.
    results = await asyncio.gather(
        *(
            generate(
                engine,
                f"js-{i}",
                "Describe a cat as JSON.",
                grammar,
                max_tokens=256,
                **params,
            )
            for i, params in enumerate(variants)
        )
    )
    for params, (text, outputs) in zip(variants, results, strict=True):
        assert outputs[-1].finish_reason is FinishReason.STOP
        value = json.loads(text)
        check_schema(value, ANIMAL)
        assert len(value["sounds"]) <= 3
        assert 0 <= value["legs"] <= 1000
        if "logprobs" in params:
            assert all(o.logprobs for o in outputs)


async def test_named_tool_choice_yields_one_block_the_parser_reads(
    engine: LlamaCppEngine,
) -> None:
    grammar = grammar_for(
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    text, outputs = await generate(
        engine, "named", "What is the weather in Paris?", grammar
    )
    assert outputs[-1].finish_reason is FinishReason.STOP
    content, calls = calls_of(text, ["get_weather", "get_time"])
    assert content == ""
    assert [name for name, _ in calls] == ["get_weather"]
    arguments = json.loads(calls[0][1])
    check_schema(arguments, WEATHER["function"]["parameters"])  # type: ignore[index]


async def test_required_without_parallel_calls_is_exactly_one_call(
    engine: LlamaCppEngine,
) -> None:
    grammar = grammar_for(
        tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False
    )
    text, outputs = await generate(engine, "req", "What time is it?", grammar)
    assert outputs[-1].finish_reason is FinishReason.STOP
    content, calls = calls_of(text, ["get_weather", "get_time"])
    assert content == ""
    assert len(calls) == 1
    name, arguments = calls[0]
    if name == "get_time":
        assert json.loads(arguments) == {}  # a parameterless tool gets {}
    else:
        assert isinstance(json.loads(arguments)["city"], str)


async def test_auto_is_free_text_or_calls_the_parser_reads(
    engine: LlamaCppEngine,
) -> None:
    grammar = grammar_for(tools=[WEATHER], tool_choice="auto")
    assert grammar is not None
    assert grammar.triggers == ("<tool_call>",)
    prompts = [
        "Say hello.",
        "Answer only with <tool_call>{...}</tool_call>: the weather in Rome?",
    ]
    results = await asyncio.gather(
        *(
            generate(engine, f"auto-{i}", user, grammar)
            for i, user in enumerate(prompts)
        )
    )
    for text, outputs in results:
        content, calls = calls_of(text, ["get_weather"])
        if "<tool_call>" in text and outputs[-1].finish_reason is FinishReason.STOP:
            assert calls  # what follows the trigger is a block
            for _, arguments in calls:
                json.loads(arguments)
            assert "<tool_call>" not in content


async def test_a_grammar_that_fails_fails_only_its_own_sequence(
    engine: LlamaCppEngine,
) -> None:
    broken = Grammar("start: this is not a grammar")
    good = grammar_for(response_format={"type": "json_object"})
    results = await asyncio.gather(
        generate(engine, "broken", "Describe a cat.", broken),
        generate(engine, "fine", "Describe a cat.", good),
        return_exceptions=True,
    )
    assert isinstance(results[0], EngineError)
    assert not isinstance(results[1], BaseException)
    json.loads(results[1][0])


async def test_a_grammar_compiled_ahead_is_taken_from_the_cache(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "ahead", "schema": ANIMAL}}
    grammar = grammar_for(response_format=fmt)
    assert grammar is not None
    engine.compile_grammar(grammar)
    engine.compile_grammar(grammar)  # already there: nothing to do
    engine.compile_grammar(Grammar("start: this is not a grammar"))  # left alone
    compiled: list[str] = []
    real = llguidance.LLMatcher

    def counting(tokenizer: Any, text: str) -> Any:
        compiled.append(text)
        return real(tokenizer, text)

    monkeypatch.setattr(llguidance, "LLMatcher", counting)
    text, _ = await generate(engine, "ahead", "Describe a cat.", grammar)
    assert compiled == []  # the worker found it compiled
    json.loads(text)
