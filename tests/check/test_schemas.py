from __future__ import annotations

from typing import Any

import pytest

from sluicegate.check.schemas import schema_errors

ANIMAL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "kind": {"const": "cat"},
        "sounds": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": 2,
        },
        "weight": {"type": ["number", "null"]},
    },
    "required": ["name", "legs"],
    "additionalProperties": False,
}

GOOD = [
    {"name": "Tom", "legs": 4},
    {"name": "Tom", "legs": 0, "unit": "c", "kind": "cat", "sounds": ["meow"]},
    {"name": "Tomas", "legs": 8, "weight": 4.5},
    {"name": "T", "legs": 4, "weight": None, "sounds": ["a", "b"]},
]
BAD = [
    ({"legs": 4}, ["$: missing required 'name'"]),
    ({"name": "Tom", "legs": "4"}, ["$.legs: expected integer, got '4'"]),
    ({"name": "Tom", "legs": True}, ["$.legs: expected integer, got True"]),
    ({"name": "Tom", "legs": 4.5}, ["$.legs: expected integer, got 4.5"]),
    ({"name": "Tom", "legs": 9}, ["$.legs: 9 > maximum 8"]),
    ({"name": "Tom", "legs": -1}, ["$.legs: -1 < minimum 0"]),
    ({"name": "", "legs": 4}, ["$.name: 0 length < minLength 1"]),
    ({"name": "Tommy!", "legs": 4}, ["$.name: 6 length > maxLength 5"]),
    ({"name": "Tom", "legs": 4, "unit": "k"}, ["$.unit: 'k' is not one of ['c', 'f']"]),
    ({"name": "Tom", "legs": 4, "kind": "dog"}, ["$.kind: 'dog' is not 'cat'"]),
    ({"name": "Tom", "legs": 4, "sounds": []}, ["$.sounds: 0 items < minItems 1"]),
    (
        {"name": "Tom", "legs": 4, "sounds": ["a", "b", "c"]},
        ["$.sounds: 3 items > maxItems 2"],
    ),
    (
        {"name": "Tom", "legs": 4, "sounds": ["a", 1]},
        ["$.sounds[1]: expected string, got 1"],
    ),
    (
        {"name": "Tom", "legs": 4, "weight": "x"},
        ["$.weight: expected number or null, got 'x'"],
    ),
    ({"name": "Tom", "legs": 4, "wings": 2}, ["$: unexpected property 'wings'"]),
    ([], ["$: expected object, got []"]),
    (
        {"legs": "4", "wings": 0},
        [
            "$: missing required 'name'",
            "$.legs: expected integer, got '4'",
            "$: unexpected property 'wings'",
        ],
    ),
]


@pytest.mark.parametrize("value", GOOD)
def test_a_value_that_keeps_every_keyword_has_no_errors(value: Any) -> None:
    assert schema_errors(value, ANIMAL) == []


@pytest.mark.parametrize(("value", "errors"), BAD)
def test_each_breach_is_named_with_its_path(value: Any, errors: list[str]) -> None:
    assert schema_errors(value, ANIMAL) == errors


def test_extra_properties_follow_their_schema_and_unknown_keywords_are_ignored() -> (
    None
):
    numbers = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert schema_errors({"a": 1, "b": 2}, numbers) == []
    assert schema_errors({"a": "1"}, numbers) == ["$.a: expected integer, got '1'"]
    loose = {"type": "string", "pattern": "^z", "format": "date"}
    assert schema_errors("abc", loose) == []
    assert schema_errors({"anything": [1]}, True) == []
    assert schema_errors(1, {"type": "unheard-of"}) == []


@pytest.mark.parametrize("value", GOOD + [value for value, _ in BAD])
def test_the_verdict_agrees_with_a_full_validator(value: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    valid = jsonschema.Draft202012Validator(ANIMAL).is_valid(value)
    assert (schema_errors(value, ANIMAL) == []) is valid
