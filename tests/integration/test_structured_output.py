"""Structured output on the real model, through the official openai SDK:
``response_format`` constrains what the model writes, streamed and not."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from .wire import (
    assert_deltas_not_cumulative,
    collect,
    complete,
    record_stream,
    response_text,
)

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

ANIMAL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "legs": {"type": "integer"},
        "sounds": {
            "type": "array",
            "items": {"type": "string", "maxLength": 20},
            "maxItems": 3,
        },
    },
    "required": ["name", "legs", "sounds"],
    "additionalProperties": False,
}
MESSAGES: Any = [{"role": "user", "content": "Describe a cat as JSON."}]


def animal_format(schema: dict[str, Any]) -> Any:
    return {
        "type": "json_schema",
        "json_schema": {"name": "animal", "schema": schema, "strict": True},
    }


def check_animal(value: Any) -> None:
    assert isinstance(value, dict)
    assert set(value) == {"name", "legs", "sounds"}
    assert isinstance(value["name"], str)
    assert isinstance(value["legs"], int)
    assert not isinstance(value["legs"], bool)
    assert isinstance(value["sounds"], list)
    assert len(value["sounds"]) <= 3
    assert all(isinstance(s, str) for s in value["sounds"])


def test_json_schema_output_matches_streamed_and_not(
    sdk: openai.OpenAI, model_id: str
) -> None:
    options: Any = {
        "model": model_id,
        "messages": MESSAGES,
        "response_format": animal_format(ANIMAL),
        "max_tokens": 200,
        "temperature": 0,
        "seed": 3,
    }
    whole = sdk.chat.completions.create(**options)
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    check_animal(json.loads(choice.message.content))
    chunks = list(sdk.chat.completions.create(**options, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content


def test_json_object_output_is_an_object(sdk: openai.OpenAI, model_id: str) -> None:
    reply = sdk.chat.completions.create(
        model=model_id,
        messages=MESSAGES,
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    content = reply.choices[0].message.content
    assert content is not None
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    else:  # max_tokens cut it: still the start of an object
        assert content.startswith("{")


def test_a_keyword_the_grammar_cannot_express_is_a_400(
    sdk: openai.OpenAI, model_id: str
) -> None:
    schema = {**ANIMAL, "not": {"required": ["wings"]}}
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model=model_id,
            messages=MESSAGES,
            response_format=animal_format(schema),
            max_tokens=8,
            stream=True,
        )
    body: Any = err.value.body
    assert body["param"] == "response_format"
    assert "'not'" in body["message"]


class Animal(BaseModel):
    name: str = Field(max_length=20)
    legs: int
    sounds: list[str] = Field(max_length=3)


def test_parse_with_a_pydantic_model_gives_the_same_object_streamed_and_not(
    sdk: openai.OpenAI, model_id: str
) -> None:
    options: Any = {
        "model": model_id,
        "messages": MESSAGES,
        "response_format": Animal,
        "max_tokens": 200,
        "temperature": 0,
    }
    whole = sdk.chat.completions.parse(**options)
    with sdk.chat.completions.stream(**options) as events:
        streamed = events.get_final_completion()
    for completion in (whole, streamed):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Animal)
        assert choice.message.content is not None
        check_animal(json.loads(choice.message.content))
        assert choice.message.parsed == Animal.model_validate_json(
            choice.message.content
        )
    assert streamed.choices[0].message.content == whole.choices[0].message.content
    assert streamed.choices[0].message.parsed == whole.choices[0].message.parsed


# -- on the wire, read with the test's own SSE reader ---------------------------

PLAIN_ANIMAL = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "legs": {"type": "integer"},
        "sounds": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "legs", "sounds"],
    "additionalProperties": False,
}


def test_streamed_json_schema_content_starts_the_object_and_equals_the_whole(
    http: httpx.Client, model_id: str
) -> None:
    body = {
        "model": model_id,
        "messages": MESSAGES,
        "response_format": animal_format(PLAIN_ANIMAL),
        "temperature": 0,
        "max_tokens": 96,
    }
    _, choices = collect(http, "/v1/chat/completions", body)
    (choice,) = choices.values()
    assert choice.deltas[0].lstrip().startswith("{"), choice.deltas[:3]
    whole = complete(http, "/v1/chat/completions", body)
    assert whole["choices"][0]["finish_reason"] == choice.finish_reason
    assert_deltas_not_cumulative(choice.deltas, response_text(whole))
    # Unbounded, the default model may list sounds until max_tokens (length);
    # the bounded schema of the test above is the one that must finish.
    if choice.finish_reason == "stop":
        check_animal(json.loads(choice.text))
    else:
        assert choice.finish_reason == "length"
        assert choice.text.startswith('{"name": "'), choice.text


def test_a_schema_keyword_the_grammar_cannot_express_is_a_400_before_any_stream(
    http: httpx.Client, model_id: str
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "format": "not-a-real-format-keyword-xyz"}
        },
        "patternProperties": {"^z": {}},
    }
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema},
        },
        "stream": True,
    }
    recorded = record_stream(http, "/v1/chat/completions", body)
    assert recorded.status == 400, recorded.body[:500]
    assert recorded.headers["content-type"].startswith("application/json")
    error = json.loads(recorded.body)["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["param"] == "response_format"
    named = ("not-a-real-format-keyword-xyz", "patternProperties")
    assert any(keyword in error["message"] for keyword in named), error
