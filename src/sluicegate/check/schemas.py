"""The JSON Schema subset the tool and structured-output probes check values against.

``schema_errors`` is pure and small on purpose: ``check`` grades any endpoint
against the schemas it sent itself, so it needs only the keywords those schemas
use, and no validator package.

Checked: ``type`` (one name or a list), ``enum``, ``const``, ``properties``,
``required``, ``additionalProperties`` (``false`` or a schema), ``items`` (one
schema), ``minItems``/``maxItems``, ``minLength``/``maxLength`` (code points),
``minimum``/``maximum``.

Deliberate divergences from JSON Schema: every other keyword (``$ref``,
``anyOf``, ``pattern``, ``format``...) is ignored, so a value may pass here and
fail a full validator; ``integer`` means a JSON number without a fraction or
exponent (Python ``int``), never ``1.0``; ``true`` and ``false`` are never
numbers.

Spec: JSON Schema 2020-12, "Validation" (the keywords above); OpenAI API
reference, "Structured Outputs" (the subset its strict mode accepts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["schema_errors"]

_TYPES: Mapping[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _is(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    return isinstance(value, _TYPES.get(name, (object,)))


def schema_errors(value: Any, schema: Any, path: str = "$") -> list[str]:
    """Where ``value`` (parsed JSON) breaks ``schema``, one message per breach.

    Args:
        value: a value as ``json.loads`` or ``orjson.loads`` gives it.
        schema: a JSON Schema object; anything that is not a mapping (``true``,
            a typo) accepts every value.
        path: where ``value`` sits, for the messages (``$.sounds[1]``).

    Returns:
        ``[]`` when the value passes every checked keyword; else messages such
        as ``"$.legs: expected integer, got '4'"``, in document order. A value
        of the wrong type gets only that one message (its contents are not
        looked at).
    """
    if not isinstance(schema, Mapping):
        return []
    wanted = schema.get("type")
    names = [wanted] if isinstance(wanted, str) else wanted
    if isinstance(names, list) and not any(_is(value, n) for n in names):
        return [f"{path}: expected {' or '.join(map(str, names))}, got {value!r}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} is not {schema['const']!r}")
    if isinstance(value, dict):
        errors += _object_errors(value, schema, path)
    elif isinstance(value, list):
        errors += _size_errors(len(value), schema, "Items", path)
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", True), f"{path}[{i}]")
    elif isinstance(value, str):
        errors += _size_errors(len(value), schema, "Length", path)
    elif _is(value, "number"):
        if isinstance(low := schema.get("minimum"), int | float) and value < low:
            errors.append(f"{path}: {value!r} < minimum {low!r}")
        if isinstance(high := schema.get("maximum"), int | float) and value > high:
            errors.append(f"{path}: {value!r} > maximum {high!r}")
    return errors


def _object_errors(
    value: dict[str, Any], schema: Mapping[str, Any], path: str
) -> list[str]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    errors = [
        f"{path}: missing required {key!r}"
        for key in schema.get("required") or ()
        if key not in value
    ]
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            errors += schema_errors(item, properties[key], f"{path}.{key}")
        elif extra is False:
            errors.append(f"{path}: unexpected property {key!r}")
        else:
            errors += schema_errors(item, extra, f"{path}.{key}")
    return errors


def _size_errors(
    size: int, schema: Mapping[str, Any], what: str, path: str
) -> list[str]:
    errors = []
    if isinstance(low := schema.get(f"min{what}"), int) and size < low:
        errors.append(f"{path}: {size} {what.lower()} < min{what} {low}")
    if isinstance(high := schema.get(f"max{what}"), int) and size > high:
        errors.append(f"{path}: {size} {what.lower()} > max{what} {high}")
    return errors
