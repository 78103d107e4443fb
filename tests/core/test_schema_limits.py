"""``measure_schema``: every limit at its bound passes and one past it is named;
references are followed through chains and cycles, the unmeasurable refused."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.schema_limits import (
    SchemaBreach,
    SchemaLimit,
    SchemaLimits,
    measure_schema,
)

LOOSE = SchemaLimits(
    max_bytes=10**9,
    max_depth=10**6,
    max_ref_chain=10**6,
    max_properties=10**6,
    max_enum=10**6,
    max_pattern_properties=10**6,
)


def limits(**bounds: int) -> SchemaLimits:
    fields = {
        "max_bytes": LOOSE.max_bytes,
        "max_depth": LOOSE.max_depth,
        "max_ref_chain": LOOSE.max_ref_chain,
        "max_properties": LOOSE.max_properties,
        "max_enum": LOOSE.max_enum,
        "max_pattern_properties": LOOSE.max_pattern_properties,
    }
    return SchemaLimits(**{**fields, **bounds})


def nested(levels: int) -> dict[str, Any]:
    """``levels`` objects of one property each: 2 * levels + 1 JSON levels."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def chain(n: int, key: str = "$defs") -> dict[str, Any]:
    """A root referring to d0, each d<i> holding a property referring to d<i+1>."""
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"n": {"$ref": f"#/{key}/d{i + 1}"}}}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": f"#/{key}/d0", key: defs}


def size(schema: Any) -> int:
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode())


def test_defaults_are_documented_values() -> None:
    assert SchemaLimits() == SchemaLimits(
        max_bytes=262144,
        max_depth=128,
        max_ref_chain=32,
        max_properties=2000,
        max_enum=2000,
        max_pattern_properties=64,
    )


@pytest.mark.parametrize(
    "field",
    [
        "max_bytes",
        "max_depth",
        "max_ref_chain",
        "max_properties",
        "max_enum",
        "max_pattern_properties",
    ],
)
def test_a_bound_below_one_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        limits(**{field: 0})


def test_an_ordinary_schema_is_within_the_defaults() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/animal.json",
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20, "default": "cat"},
            "legs": {"type": "integer", "enum": [2, 4]},
            "kind": {"const": "animal"},
            "owner": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
        },
        "required": ["name", "legs"],
        "$defs": {
            "Person": {"type": "object", "properties": {"n": {"type": "string"}}}
        },
    }
    assert measure_schema(schema, SchemaLimits()) is None


# -- depth ---------------------------------------------------------------------


def test_depth_at_the_bound_passes_and_one_past_is_named() -> None:
    schema = nested(10)  # 21 JSON levels
    assert measure_schema(schema, limits(max_depth=21)) is None
    assert measure_schema(schema, limits(max_depth=20)) == SchemaBreach(
        SchemaLimit.DEPTH, 21, 20
    )


def test_depth_counts_arrays_and_data_too() -> None:
    schema = {"type": "array", "items": [[[{"type": "null"}]]], "default": [[[[1]]]]}
    assert measure_schema(schema, limits(max_depth=5)) is None
    breach = measure_schema(schema, limits(max_depth=4))
    assert breach is not None
    assert breach.limit is SchemaLimit.DEPTH


def test_depth_is_counted_through_references() -> None:
    # root (1) -> d0 (3 levels each) -> ... -> d4 -> d5 (1 level)
    schema = chain(5)
    assert measure_schema(schema, limits(max_depth=1 + 5 * 3 + 1)) is None
    breach = measure_schema(schema, limits(max_depth=16))
    assert breach == SchemaBreach(SchemaLimit.DEPTH, 17, 16)


def test_a_deep_schema_is_measured_without_recursion() -> None:
    schema: Any = {"type": "string"}
    for _ in range(sys.getrecursionlimit() * 3):
        schema = {"items": schema}
    breach = measure_schema(schema, SchemaLimits())
    assert breach is not None
    assert breach.limit is SchemaLimit.DEPTH


# -- references ----------------------------------------------------------------


@pytest.mark.parametrize("key", ["$defs", "definitions"])
def test_a_ref_chain_at_the_bound_passes_and_one_past_is_named(key: str) -> None:
    schema = chain(9, key)  # d0 ... d9: 10 definitions entered
    assert measure_schema(schema, limits(max_ref_chain=10)) is None
    assert measure_schema(schema, limits(max_ref_chain=9)) == SchemaBreach(
        SchemaLimit.REF_CHAIN, 10, 9
    )


def test_the_thousand_definition_chain_is_refused() -> None:
    breach = measure_schema(chain(1000), SchemaLimits())
    assert breach == SchemaBreach(SchemaLimit.REF_CHAIN, 1001, 32)


def test_a_recursive_schema_is_allowed_and_charged_once() -> None:
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
    }
    # The root is compiled, then entered once more through "#".
    assert measure_schema(tree, limits(max_depth=8, max_ref_chain=1)) is None
    assert measure_schema(tree, limits(max_depth=7)) == SchemaBreach(
        SchemaLimit.DEPTH, 8, 7
    )


def test_a_cycle_is_charged_all_of_its_members() -> None:
    defs = {
        "a": {"properties": {"x": {"$ref": "#/$defs/b"}}},
        "b": {"properties": {"x": {"$ref": "#/$defs/c"}}},
        "c": {
            "properties": {"x": {"$ref": "#/$defs/a"}},
            "items": {"$ref": "#/$defs/z"},
        },
        "z": {"type": "string"},
    }
    schema = {"$ref": "#/$defs/a", "$defs": defs}
    assert measure_schema(schema, limits(max_ref_chain=4)) is None
    assert measure_schema(schema, limits(max_ref_chain=3)) == SchemaBreach(
        SchemaLimit.REF_CHAIN, 4, 3
    )
    # root 1 + a, b, c 3 levels each + z 1
    assert measure_schema(schema, limits(max_depth=11)) is None
    assert measure_schema(schema, limits(max_depth=10)) == SchemaBreach(
        SchemaLimit.DEPTH, 11, 10
    )


def test_a_shared_definition_counts_on_its_longest_path() -> None:
    defs = {
        "a": {"items": {"$ref": "#/$defs/b"}},
        "b": {"items": {"items": {"type": "null"}}},
    }
    schema = {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}], "$defs": defs}
    # root 3 + a 2 + b 3; two definitions on the path through a
    assert measure_schema(schema, limits(max_depth=8, max_ref_chain=2)) is None
    assert measure_schema(schema, limits(max_ref_chain=1)) == SchemaBreach(
        SchemaLimit.REF_CHAIN, 2, 1
    )


def test_a_ref_to_a_missing_definition_is_a_leaf() -> None:
    schema = {"$ref": "#/$defs/nowhere", "$defs": {"x": {"type": "null"}}}
    assert measure_schema(schema, limits(max_ref_chain=1, max_depth=1)) is None


def test_escaped_definition_names_are_followed() -> None:
    schema = {
        "$ref": "#/$defs/a~1b~0c",
        "$defs": {"a/b~c": {"items": {"$ref": "#/$defs/a~1b~0c"}}},
    }
    assert measure_schema(schema, limits(max_ref_chain=1)) is None
    assert measure_schema(schema, limits(max_depth=2)) == SchemaBreach(
        SchemaLimit.DEPTH, 3, 2
    )


@pytest.mark.parametrize(
    ("schema", "detail"),
    [
        ({"$ref": "#/properties/a"}, "$ref '#/properties/a'"),
        ({"$ref": "#/$defs/"}, "$ref '#/$defs/'"),
        ({"$ref": "#/$defs/a%62"}, "$ref '#/$defs/a%62'"),
        ({"$ref": "other.json"}, "$ref 'other.json'"),
        ({"$ref": "#anchor"}, "$ref '#anchor'"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef '#meta'"),
        ({"$recursiveRef": "#"}, "$recursiveRef '#'"),
        ({"items": {"$id": "inner.json"}}, "$id 'inner.json'"),
        ({"$defs": {"a": {"$id": 7}}, "$ref": "#/$defs/a"}, "$id int"),
        (
            {"$schema": "http://json-schema.org/draft-04/schema#"},
            "$schema 'http://json-schema.org/draft-04/schema#'",
        ),
        ({"$ref": "#/x/" + "x" * 200}, "$ref " + repr("#/x/" + "x" * 200)[:80] + "..."),
    ],
)
def test_references_that_cannot_be_measured_are_refused(
    schema: dict[str, Any], detail: str
) -> None:
    assert measure_schema(schema, LOOSE) == SchemaBreach(SchemaLimit.REF, 0, 0, detail)


def test_keywords_in_data_and_names_are_not_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {"$ref": {"type": "string"}, "$id": {"type": "string"}},
        "default": {"$ref": "#/properties/x", "$id": "x"},
        "enum": [{"$dynamicRef": "#x"}],
        "items": {"$defs": {"a": {"$ref": "#/nowhere"}}},
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": 7,
    }
    assert measure_schema(schema, LOOSE) is None


# -- counts --------------------------------------------------------------------


def test_properties_at_the_bound_pass_and_one_past_is_named() -> None:
    schema = {
        "properties": {f"p{i}": {} for i in range(6)},
        "patternProperties": {"^x": {"properties": {"q": {}}}},
        "dependentSchemas": {"p0": {}},
    }
    assert measure_schema(schema, limits(max_properties=8)) is None
    assert measure_schema(schema, limits(max_properties=7)) == SchemaBreach(
        SchemaLimit.PROPERTIES, 8, 7
    )


def test_pattern_properties_of_one_object_at_the_bound_pass_and_one_past_is_named() -> (
    None
):
    """The bound is per object: the compiler's work grows with about the cube
    of one object's patterns, so two objects of 4 pass a bound of 4."""
    four: dict[str, Any] = {f"^p{i}": {} for i in range(4)}
    schema = {
        "patternProperties": four,
        "properties": {"inner": {"patternProperties": four}},
    }
    assert measure_schema(schema, limits(max_pattern_properties=4)) is None
    five = {"patternProperties": {**four, "^q": {}}}
    assert measure_schema(five, limits(max_pattern_properties=4)) == SchemaBreach(
        SchemaLimit.PATTERN_PROPERTIES, 5, 4
    )
    assert measure_schema({"patternProperties": "bad"}, limits()) is None


def test_enum_items_and_consts_at_the_bound_pass_and_one_past_is_named() -> None:
    schema = {"anyOf": [{"enum": list(range(5))}, {"const": "x"}, {"enum": "bad"}]}
    assert measure_schema(schema, limits(max_enum=6)) is None
    assert measure_schema(schema, limits(max_enum=5)) == SchemaBreach(
        SchemaLimit.ENUM, 6, 5
    )


def test_a_huge_enum_stops_the_walk_at_once() -> None:
    breach = measure_schema({"enum": list(range(10**6))}, SchemaLimits())
    assert breach == SchemaBreach(SchemaLimit.ENUM, 10**6, 2000)


# -- bytes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "description": "caf\u00e9 \U0001f600", "maxLength": 5},
        {"enum": [None, True, False, 1.5, -3, [], [1, 2], {}, 2**59, -(2**59)]},
        {"properties": {"a": {"type": ["string", "null"]}}, "required": ["a"]},
        {"$defs": {"x": {"const": "y"}, "": {}}, "$ref": "#/$defs/x"},
        {"definitions": {"x": {}}, "$defs": {"y": {}}},
        [],
        "just a string",
    ],
)
def test_bytes_are_the_compact_json_size(schema: Any) -> None:
    n = size(schema)
    assert measure_schema(schema, limits(max_bytes=n)) is None
    breach = measure_schema(schema, limits(max_bytes=n - 1))
    assert breach is not None
    assert breach.limit is SchemaLimit.BYTES
    assert breach.bound == n - 1
    assert breach.seen > n - 1


def test_a_huge_integer_is_sized_without_printing_it() -> None:
    breach = measure_schema({"const": 10**50000}, limits(max_bytes=1000))
    assert breach is not None
    assert breach.limit is SchemaLimit.BYTES


def test_the_walk_stops_at_the_byte_bound() -> None:
    schema = {"enum": ["x" * 100] * 100_000}
    breach = measure_schema(schema, limits(max_bytes=1000))
    assert breach is not None
    assert breach.limit is SchemaLimit.BYTES


# -- any input -----------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["type", "properties", "items", "$ref", "$defs", "enum", "anyOf", "x"]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=30,
)


@given(JSON)
def test_any_json_value_is_measured_without_raising(value: Any) -> None:
    breach = measure_schema(value, SchemaLimits())
    assert breach is None or isinstance(breach.limit, SchemaLimit)
