"""Structured output on the real model, through the official openai SDK:
``response_format`` constrains what the model writes, streamed and not."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

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
