"""A request's JSON schemas against the schema limits, and their options.

Every route that takes a schema becomes a chat request (Responses ``text.format``
and tools, Messages tools and ``count_tokens`` included), and ``check_schemas``
measures each of its schemas (``core/schema_limits.py``) before anything else
reads them: the pydantic dump, the chat template's tool rendering, the grammar
compiler. A breach is a ``RequestError`` (400) naming the limit, its setting and
the parameter: ``response_format`` (``text.format`` in the Responses API) or
``tools[i].function.parameters`` (``tools[i].parameters``, Messages
``tools[i].input_schema``).

Spec: docs/security.md, "Schema limits".
"""

from __future__ import annotations

import argparse
from typing import Any

from sluicegate.core.errors import RequestError
from sluicegate.core.schema_limits import (
    SchemaBreach,
    SchemaLimit,
    SchemaLimits,
    measure_schema,
)
from sluicegate.server.schemas.chat import ChatCompletionRequest

__all__ = [
    "SCHEMA_LIMIT_CODE",
    "add_schema_options",
    "breach_error",
    "check_schemas",
    "schema_config_fields",
]

SCHEMA_LIMIT_CODE = "schema_limit_exceeded"
"""The ``code`` of a 400 for a schema past a limit."""

_FLAGS = {
    SchemaLimit.BYTES: "--schema-max-bytes",
    SchemaLimit.DEPTH: "--schema-max-depth",
    SchemaLimit.REF_CHAIN: "--schema-max-ref-chain",
    SchemaLimit.PROPERTIES: "--schema-max-properties",
    SchemaLimit.PATTERN_PROPERTIES: "--schema-max-pattern-properties",
    SchemaLimit.ENUM: "--schema-max-enum",
}
_WHAT = {
    SchemaLimit.BYTES: "of more than {bound} bytes",
    SchemaLimit.DEPTH: "nested more than {bound} levels deep (counted through $ref)",
    SchemaLimit.REF_CHAIN: "whose $ref chains enter more than {bound} definitions",
    SchemaLimit.PROPERTIES: "with more than {bound} properties",
    SchemaLimit.PATTERN_PROPERTIES: (
        "with more than {bound} patternProperties in one object"
    ),
    SchemaLimit.ENUM: "with more than {bound} enum and const values",
}


def check_schemas(request: ChatCompletionRequest, limits: SchemaLimits) -> None:
    """Measure the request's response format schema and each tool's parameters.

    Raises:
        RequestError: 400 at the first schema past a limit (``breach_error``).
    """
    response_format = request.response_format
    if response_format is not None and response_format.json_schema is not None:
        schema = response_format.json_schema.schema_
        if schema is not None:
            _check(schema, limits, "response_format")
    for i, tool in enumerate(request.tools):
        parameters = tool.function.parameters
        if parameters is not None:
            _check(parameters, limits, f"tools[{i}].function.parameters")


def _check(schema: Any, limits: SchemaLimits, param: str) -> None:
    breach = measure_schema(schema, limits)
    if breach is not None:
        raise breach_error(breach, param)


def breach_error(breach: SchemaBreach, param: str) -> RequestError:
    """The 400 of one breach: the message names the parameter, the limit, its
    bound and the setting that changes it (``ref``: what was refused)."""
    if breach.limit is SchemaLimit.REF:
        return RequestError(
            f"{param} is a JSON schema with {breach.detail}, which sluicegate "
            f"does not follow: $ref must be '#', '#/$defs/NAME' or "
            f"'#/definitions/NAME', with no $id below the top",
            param=param,
            code="unsupported_schema",
        )
    what = _WHAT[breach.limit].format(bound=breach.bound)
    return RequestError(
        f"{param} is a JSON schema {what} (measured {breach.seen}; "
        f"schema limit {breach.limit.value!r}, set by {_FLAGS[breach.limit]})",
        param=param,
        code=SCHEMA_LIMIT_CODE,
    )


def add_schema_options(serve: argparse.ArgumentParser) -> None:
    """``--schema-max-*`` and ``--schema-timeout-s`` on the ``serve`` parser."""
    default = SchemaLimits()
    group = serve.add_argument_group("schema limits (docs/security.md)")
    add = group.add_argument
    add("--schema-max-bytes", type=int, default=default.max_bytes, help="bytes")
    add(
        "--schema-max-depth",
        type=int,
        default=default.max_depth,
        help="JSON levels, counted through $ref",
    )
    add(
        "--schema-max-ref-chain",
        type=int,
        default=default.max_ref_chain,
        help="$ref definitions one path enters",
    )
    add("--schema-max-properties", type=int, default=default.max_properties)
    add("--schema-max-enum", type=int, default=default.max_enum)
    add(
        "--schema-max-pattern-properties",
        type=int,
        default=default.max_pattern_properties,
        help="patternProperties of one object",
    )
    add(
        "--schema-timeout-s",
        type=float,
        default=10.0,
        help="seconds to check and compile a request's schemas (off the event loop)",
    )


def schema_config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``ServerConfig`` keyword arguments from ``add_schema_options``' options.

    Raises:
        SystemExit: a limit below 1 (the message names it).
    """
    try:
        limits = SchemaLimits(
            max_bytes=args.schema_max_bytes,
            max_depth=args.schema_max_depth,
            max_ref_chain=args.schema_max_ref_chain,
            max_properties=args.schema_max_properties,
            max_enum=args.schema_max_enum,
            max_pattern_properties=args.schema_max_pattern_properties,
        )
    except ValueError as exc:
        raise SystemExit(f"sluicegate: schema limit: {exc}") from exc
    return {"schema_limits": limits, "schema_timeout_s": args.schema_timeout_s}
