"""Requests to grammars: which constraint each request gets, what it lets through,
and which schemas are refused (server/prepare/constraints.py)."""

from __future__ import annotations

from typing import Any

import llguidance
import pytest

from sluicegate.core.decoding.reasoning_parsers import reasoning_parser
from sluicegate.core.errors import RequestError
from sluicegate.engines.base import Grammar
from sluicegate.engines.llamacpp.grammar import GrammarCompiler
from sluicegate.engines.llamacpp.vocab import LlamaTokenizer, load_vocab
from sluicegate.model import default_model_path
from sluicegate.server.prepare.constraints import (
    NO_TOOL_MARKUP,
    closed_objects,
    grammar_for,
    reasoning_grammar,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
# How clients usually describe a tool without arguments; JSON Schema alone would
# let any object through.
NO_ARGUMENTS = {"type": "object", "properties": {}}
PARIS = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
ROME = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
TIME = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


def json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# -- which grammar ---------------------------------------------------------------


@pytest.mark.parametrize(
    "request_fields",
    [
        {},
        {"response_format": {"type": "text"}},
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tool_choice": "auto"},  # no tools: nothing to call
    ],
)
def test_free_text_gets_no_grammar(request_fields: dict[str, Any]) -> None:
    assert grammar_for(**request_fields) is None


def test_only_auto_is_lazy() -> None:
    auto = grammar_for(tools=[WEATHER])
    assert auto is not None
    assert auto.triggers == ("<tool_call>",)
    choices: list[str | dict[str, Any]] = [
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
    ]
    for choice in choices:
        grammar = grammar_for(tools=[WEATHER], tool_choice=choice)
        assert grammar is not None
        assert grammar.triggers == ()
    grammar = grammar_for(response_format={"type": "json_object"})
    assert grammar is not None
    assert grammar.triggers == ()


# -- refusals --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "not": {"required": ["a"]}}, "not"),
        (
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "uniqueItems",
        ),
        ({"type": "array", "contains": {"type": "string"}}, "contains"),
        ({"if": {"type": "string"}, "then": {"maxLength": 3}}, "if"),
    ],
)
def test_a_keyword_the_grammar_cannot_express_is_a_400_naming_it(
    schema: dict[str, Any], keyword: str
) -> None:
    with pytest.raises(RequestError) as err:
        grammar_for(response_format=json_schema(schema))
    assert err.value.param == "response_format"
    assert repr(keyword) in err.value.message
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(RequestError) as err:
        grammar_for(tools=[tool], tool_choice="required")
    assert err.value.param == "tools"
    assert repr(keyword) in err.value.message
    assert "'f'" in err.value.message


def test_a_schema_that_does_not_compile_is_a_400() -> None:
    with pytest.raises(RequestError) as err:
        grammar_for(response_format=json_schema({"type": "string", "pattern": "(["}))
    assert err.value.param == "response_format"
    with pytest.raises(RequestError) as err:
        grammar_for(response_format=json_schema(["not", "a", "schema"]))
    assert err.value.param == "response_format"


def test_tool_choice_must_name_a_given_tool() -> None:
    with pytest.raises(RequestError) as err:
        grammar_for(
            tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}}
        )
    assert err.value.param == "tool_choice"
    with pytest.raises(RequestError) as err:
        grammar_for(tools=[WEATHER], tool_choice="sometimes")
    assert err.value.param == "tool_choice"
    with pytest.raises(RequestError) as err:
        grammar_for(response_format={"type": "yaml"})
    assert err.value.param == "response_format"


# -- what each grammar lets through (the real vocabulary) ------------------------


@pytest.fixture(scope="module")
def vocab() -> tuple[LlamaTokenizer, GrammarCompiler]:
    tokenizer = load_vocab(default_model_path())
    return tokenizer, GrammarCompiler(tokenizer)


def accepts(
    vocab: tuple[LlamaTokenizer, GrammarCompiler], grammar: Grammar | None, text: str
) -> bool:
    """Whether ``text``, tokenized, is a complete output of ``grammar``."""
    assert grammar is not None
    tokenizer, compiler = vocab
    matcher = llguidance.LLMatcher(compiler.lltokenizer(), grammar.text)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer.encode(text, add_special=False, parse_special=False)
    if matcher.validate_tokens(ids) != len(ids):
        return False
    matcher.consume_tokens(ids)
    return bool(matcher.is_accepting())


needs_model = pytest.mark.llamacpp


@needs_model
def test_auto_lets_text_through_and_constrains_from_the_trigger(vocab: Any) -> None:
    auto = grammar_for(tools=[WEATHER, CLOCK])
    assert accepts(vocab, auto, "Hello! No tool is needed.")
    assert accepts(vocab, auto, "Let me look. " + PARIS)
    assert accepts(vocab, auto, PARIS + "\n" + ROME + "\n")
    assert accepts(vocab, auto, TIME)
    assert not accepts(vocab, auto, "Let me look. <tool_call>the weather")
    assert not accepts(vocab, auto, PARIS + " and some more text")
    assert not accepts(vocab, auto, PARIS.replace('"name": ', '"name":'))  # style
    assert not accepts(vocab, auto, PARIS.replace("get_weather", "get_rain"))
    swapped = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}'
    assert not accepts(vocab, auto, swapped + "</tool_call>")
    single = grammar_for(tools=[WEATHER], parallel_tool_calls=False)
    assert accepts(vocab, single, "Sure. " + PARIS)
    assert not accepts(vocab, single, PARIS + "\n" + ROME)


@needs_model
def test_required_and_named_calls_admit_only_blocks(vocab: Any) -> None:
    required = grammar_for(tools=[WEATHER, CLOCK], tool_choice="required")
    assert accepts(vocab, required, PARIS + " " + TIME)
    assert not accepts(vocab, required, "Sure. " + PARIS)
    assert not accepts(vocab, required, "")
    assert not accepts(vocab, required, TIME.replace("{}", '{"zone": "UTC"}'))
    one = grammar_for(
        tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False
    )
    assert accepts(vocab, one, TIME + "\n")
    assert not accepts(vocab, one, TIME + "\n" + PARIS)
    named = grammar_for(
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert accepts(vocab, named, ROME)
    assert not accepts(vocab, named, TIME)
    assert not accepts(vocab, named, ROME + "\n" + PARIS)  # exactly one call


@needs_model
def test_parameters_with_references_are_checked(vocab: Any) -> None:
    parameters = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/place"}},
        "required": ["where"],
        "additionalProperties": False,
        "$defs": {
            "place": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            }
        },
    }
    tool = {"type": "function", "function": {"name": "go", "parameters": parameters}}
    grammar = grammar_for(tools=[tool], tool_choice="required")
    good = '<tool_call>{"name": "go", "arguments": {"where": {"city": "Oslo"}}}'
    good += "</tool_call>"
    assert accepts(vocab, grammar, good)
    assert not accepts(vocab, grammar, good.replace('"city"', '"town"'))


@needs_model
def test_response_formats_admit_only_matching_json(vocab: Any) -> None:
    obj = grammar_for(response_format={"type": "json_object"})
    assert accepts(vocab, obj, '{"a": [1, 2.5, "x", null, true]}')
    assert not accepts(vocab, obj, "[1, 2]")
    assert not accepts(vocab, obj, 'Here: {"a": 1}')
    schema = {
        "type": "object",
        "properties": {"legs": {"type": "integer"}},
        "required": ["legs"],
        "additionalProperties": False,
    }
    typed = grammar_for(response_format=json_schema(schema))
    assert accepts(vocab, typed, '{"legs": 4}')
    assert not accepts(vocab, typed, '{"legs": "four"}')
    assert not accepts(vocab, typed, '{"legs": 4, "tail": true}')
    both = grammar_for(response_format=json_schema(schema), tools=[WEATHER])
    assert accepts(vocab, both, '{"legs": 4}')
    assert accepts(vocab, both, PARIS)
    assert not accepts(vocab, both, "Hello")


@needs_model
def test_a_turn_that_may_not_call_admits_text_but_no_tool_markup(vocab: Any) -> None:
    assert accepts(vocab, NO_TOOL_MARKUP, "It is 18 degrees and clear in Paris.")
    assert accepts(vocab, NO_TOOL_MARKUP, "a < b, and <tool> is a word.\n")
    assert not accepts(vocab, NO_TOOL_MARKUP, PARIS)
    assert not accepts(vocab, NO_TOOL_MARKUP, "Sure.\n<tool_response>{}")
    assert not accepts(vocab, NO_TOOL_MARKUP, "<<tool_x")
    assert not accepts(vocab, NO_TOOL_MARKUP, "<tool<tool_")
    assert accepts(vocab, NO_TOOL_MARKUP, "<to<x, a<tool")
    # The prefix dies at the "_": the mask forbids it, not only the end.
    tokenizer, compiler = vocab
    matcher = llguidance.LLMatcher(compiler.lltokenizer(), NO_TOOL_MARKUP.text)
    ids = tokenizer.encode(PARIS, add_special=False, parse_special=False)
    assert matcher.validate_tokens(ids) < len(ids)


# -- objects closed unless they say otherwise ---------------------------------------


def test_objects_that_list_properties_are_closed_at_every_depth() -> None:
    schema = {
        "type": "object",
        "properties": {
            "where": {"$ref": "#/$defs/place"},
            "stops": {"type": "array", "items": {"type": "object", "properties": {}}},
            "either": {
                "anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]
            },
        },
        "$defs": {"place": {"type": "object", "properties": {"city": {}}}},
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["stops"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert props["either"]["anyOf"][1] == {"type": "null"}
    assert closed["$defs"]["place"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's own is not changed


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},  # no properties listed: any object, as json_object
        {"type": "object", "properties": {}, "additionalProperties": True},
        {
            "type": "object",
            "properties": {},
            "additionalProperties": {"type": "string"},
        },
        {"type": "object", "properties": {}, "patternProperties": {"^x": {}}},
        {"type": "object", "properties": {"a": {}}, "required": ["b"]},
        {
            "allOf": [
                {"type": "object", "properties": {"a": {}}},
                {"properties": {"b": {}}},
            ]
        },
        {
            "type": "object",
            "properties": {"k": {}},
            "oneOf": [{"properties": {"x": {}}}],
        },
        {"not": {"type": "object", "properties": {}}},
    ],
)
def test_objects_that_may_hold_other_keys_stay_open(schema: dict[str, Any]) -> None:
    assert closed_objects(schema) == schema


@needs_model
def test_a_tool_described_without_arguments_takes_only_empty_arguments(
    vocab: Any,
) -> None:
    tool = {
        "type": "function",
        "function": {"name": "get_time", "parameters": NO_ARGUMENTS},
    }
    grammar = grammar_for(tools=[tool], tool_choice="required")
    assert accepts(vocab, grammar, TIME)
    assert not accepts(vocab, grammar, TIME.replace("{}", '{"type": "object"}'))
    open_tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {**NO_ARGUMENTS, "additionalProperties": True},
        },
    }
    grammar = grammar_for(tools=[open_tool], tool_choice="required")
    assert accepts(vocab, grammar, TIME.replace("{}", '{"zone": "UTC"}'))


@needs_model
def test_a_response_schema_without_additional_properties_admits_only_its_keys(
    vocab: Any,
) -> None:
    schema = {"type": "object", "properties": {"legs": {"type": "integer"}}}
    grammar = grammar_for(response_format=json_schema(schema))
    assert accepts(vocab, grammar, '{"legs": 4}')
    assert accepts(vocab, grammar, "{}")  # nothing required
    assert not accepts(vocab, grammar, '{"legs": 4, "tail": true}')


@needs_model
def test_a_grammar_wrapped_for_reasoning_applies_after_the_end_marker(
    vocab: Any,
) -> None:
    schema = {
        "type": "object",
        "properties": {"legs": {"type": "integer"}},
        "required": ["legs"],
        "additionalProperties": False,
    }
    answer = '{"legs": 4}'
    typed = grammar_for(response_format=json_schema(schema))
    assert typed is not None
    inside = reasoning_grammar(typed, reasoning_parser("deepseek_r1"))
    assert accepts(vocab, inside, "A cat has four.</think>\n\n" + answer)
    assert accepts(vocab, inside, "Four.</think>" + answer)
    assert not accepts(vocab, inside, answer)  # the prompt opened the reasoning
    assert not accepts(vocab, inside, "Four.</think>Four legs.")
    assert not accepts(
        vocab, inside, "a</think>b</think>" + answer
    )  # the first ends it
    outside = reasoning_grammar(typed, reasoning_parser("qwen3"))
    assert accepts(vocab, outside, answer)
    assert accepts(vocab, outside, "<think>Four.</think>\n" + answer)
    assert not accepts(vocab, outside, "Four.</think>" + answer)
    required = grammar_for(tools=[WEATHER], tool_choice="required")
    assert required is not None
    both = reasoning_grammar(required, reasoning_parser("deepseek_r1"))
    assert accepts(vocab, both, "Paris, then.</think>\n" + PARIS)
    assert not accepts(vocab, both, "Paris, then.</think>\nIt rains.")
    auto = grammar_for(tools=[WEATHER])
    assert auto is not None
    lazy = reasoning_grammar(auto, reasoning_parser("qwen3"))
    assert lazy.triggers == auto.triggers
    assert accepts(vocab, lazy, "<think>Look it up.</think>\n\nSure. " + PARIS)
    assert accepts(vocab, lazy, "No tool is needed.")
