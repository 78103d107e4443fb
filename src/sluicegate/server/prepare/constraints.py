"""Requests to constraints: the grammar structured output and tool calls decode under.

What each chat request asks for, and what its grammar (``Grammar``,
engines/base.py) lets the model write:

- ``response_format`` ``json_object``: one JSON object; ``json_schema``: one
  JSON value matching ``json_schema.schema``.
- ``tool_choice: "required"``: one or more tool-call blocks (exactly one with
  ``parallel_tool_calls: false``).
- ``tool_choice`` naming a function: exactly one block, calling it.
- ``tool_choice: "auto"`` (the default with ``tools``): free text; from the
  first ``<tool_call>`` on, blocks only (at most one with
  ``parallel_tool_calls: false``). A lazy grammar: text before the trigger is
  never masked.
- ``"auto"`` with a JSON ``response_format``: the JSON value, or blocks from
  the first token.
- ``tool_choice: "none"`` or no ``tools``: the response format's constraint
  alone; ``None`` (free text) for ``text``.

A block is ``<tool_call>{"name": "<name>", "arguments": <JSON object>}</tool_call>``,
the keys in that order, the arguments matching the tool's ``parameters`` (a tool
without ``parameters`` takes ``{}``); blocks are separated by one or two spaces
or newlines, and one or two may follow the last. The grammar writes JSON with
``", "`` and ``": "`` separators and no other whitespace, so a small model cannot
run away into blank space.

An object schema that lists ``properties`` and says nothing of
``additionalProperties`` (nor ``patternProperties``, ``unevaluatedProperties``
or ``allOf``) is closed: only its own properties are written, as llama.cpp's
JSON-schema converter does (JSON Schema would allow any other key, and a small
model fills them with made-up ones: a tool described as taking no arguments,
``{"type": "object", "properties": {}}``, gets ``{}``). Every output still
matches the schema as sent; ``"additionalProperties": true`` keeps an object
open.

Every schema is compiled before the response's status is sent: a keyword the
constraint cannot express (``unimplemented_keywords``; for example ``not``,
``if``/``then``/``else``, ``uniqueItems``, ``contains``) or a schema that does not
compile is a ``RequestError`` (400) naming it, with param ``response_format`` or
``tools``.

Spec: OpenAI API reference, "Create chat completion" (``response_format``,
``tools``, ``tool_choice``, ``parallel_tool_calls``); docs/tools.md for the block
format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sluicegate.core.decoding.reasoning_parsers import ReasoningParser
from sluicegate.core.errors import RequestError
from sluicegate.engines.base import Grammar
from sluicegate.server.schemas.chat import ChatCompletionRequest

__all__ = [
    "NO_TOOL_MARKUP",
    "TOOL_CALL_TRIGGER",
    "closed_objects",
    "grammar_for",
    "grammar_for_request",
    "reasoning_grammar",
]

TOOL_CALL_TRIGGER = "<tool_call>"
"""The text that opens a tool-call block, and the trigger of the lazy grammar."""

# Text without "<tool_", as a regex with no complement (llguidance's ``~`` does
# not prune a dead prefix): an item is a character other than "<", or a run of
# partial openings ("<", "<t", ... "<tool") ended by a character that breaks the
# last one; the text may end inside a partial opening.
_PARTIAL = "(<|<t|<to|<too|<tool)"
_BREAK = "(<[^<t]|<t[^<o]|<to[^<o]|<too[^<l]|<tool[^<_])"
NO_TOOL_MARKUP = Grammar(
    f"%llguidance {{}}\nstart: TEXT\nTEXT: /([^<]|{_PARTIAL}*{_BREAK})*{_PARTIAL}*/\n"
)
"""Free text that never holds ``<tool_``: the constraint of a turn that may not
call (``tool_choice: "none"``) after a prompt that shows tools or past calls, so
that the model writes an answer instead of imitating the call blocks it saw."""

_JSON_STYLE = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_NO_ARGUMENTS: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}
_ERROR_CHARS = 300  # of llguidance's message, in a 400's message


def grammar_for_request(request: ChatCompletionRequest) -> Grammar | None:
    """``grammar_for`` of a validated chat request's fields.

    Raises:
        RequestError: as ``grammar_for``.
    """
    choice = request.tool_choice
    return grammar_for(
        response_format=None
        if request.response_format is None
        else request.response_format.model_dump(mode="json", by_alias=True),
        tools=[t.model_dump(mode="json", exclude_none=True) for t in request.tools],
        tool_choice=choice if isinstance(choice, str | None) else choice.model_dump(),
        parallel_tool_calls=request.parallel_tool_calls,
    )


def grammar_for(
    *,
    response_format: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
    tool_choice: str | Mapping[str, Any] | None = None,
    parallel_tool_calls: bool = True,
) -> Grammar | None:
    """The constraint a chat request decodes under, or ``None`` for free text.

    Args:
        response_format: the request's ``response_format`` as sent (JSON values).
        tools: the request's ``tools`` (``{"type": "function", "function": {...}}``).
        tool_choice: ``"none"``, ``"auto"``, ``"required"``, a named function, or
            ``None`` (``"auto"`` with tools, ``"none"`` without).
        parallel_tool_calls: ``False``: at most one call (exactly one when
            required).

    Returns:
        A ``Grammar`` (lazy, with ``triggers == ("<tool_call>",)``, for ``auto``),
        or ``None`` when nothing constrains the output.

    Raises:
        RequestError: a schema keyword the constraint cannot express, a schema
            that does not compile, or a ``tool_choice`` naming no given tool.
    """
    value = _response_schema(response_format)
    choice = _tool_choice(tool_choice, tools)
    if value is not None:
        _check(_json_rule(value), "response_format", "response_format")
    if choice is None:
        if value is None:
            return None
        return Grammar(f"%llguidance {{}}\nstart: {_json_rule(value)}\n")
    mode, names = choice
    rules = _call_rules(tools, names)
    if mode == "auto" and value is None:
        more = " (SEP block)*" if parallel_tool_calls else ""
        top = [
            f'start: TEXT | head call "</tool_call>"{more} SEP?',
            f"head[lazy]: TEXT {json.dumps(TOOL_CALL_TRIGGER)}",
            r"TEXT: /(.|\n)*/",
        ]
        triggers: tuple[str, ...] = (TOOL_CALL_TRIGGER,)
    else:
        many = parallel_tool_calls and mode != "named"
        blocks = "block (SEP block)* SEP?" if many else "block SEP?"
        start = blocks if value is None else f"value | {blocks}"
        top = [f"start: {start}"]
        if value is not None:
            top.append(f"value: {_json_rule(value)}")
        triggers = ()
    text = "\n".join(
        [
            "%llguidance {}",
            *top,
            f"block: {json.dumps(TOOL_CALL_TRIGGER)} call " + '"</tool_call>"',
            *rules,
            r"SEP: /[ \n]{1,2}/",
            "",
        ]
    )
    _check(text, "tools", "the tool-call grammar")
    return Grammar(text, triggers)


def reasoning_grammar(grammar: Grammar, parser: ReasoningParser) -> Grammar:
    """``grammar`` applied only once the reasoning has ended.

    The output is a reasoning block (any text up to the first end marker, then
    up to four spaces or newlines, as DeepSeek-R1 writes ``"</think>\n\n"``),
    then what ``grammar`` admits. When ``parser`` starts inside, the block is
    required (the prompt opened it: the answer comes after the end marker);
    otherwise it is optional and opens with the start marker, so a model that
    answers at once may (an optional block that needs no start marker would let
    the reasoning's free text swallow the answer's first characters).

    Args:
        grammar: a whole grammar of this module (its root rule ``start``).
        parser: the request's markers (``starts_inside`` decided).

    Returns:
        The combined grammar, as lazy as ``grammar`` (its triggers kept).
    """
    header, _, body = grammar.text.partition("\n")
    body = body.replace("start:", "reasoned_answer:", 1)
    block = "reasoning_block REASONING_GAP? reasoned_answer"
    if parser.starts_inside:
        start = f"start: {block}"
    else:
        start = f"start: reasoned_answer | {json.dumps(parser.start)} {block}"
    text = "\n".join(
        [
            header,
            start,
            f"reasoning_block[lazy]: REASONING_TEXT {json.dumps(parser.end)}",
            r"REASONING_TEXT: /(.|\n)*/",
            r"REASONING_GAP: /[ \n]{1,4}/",
            body,
        ]
    )
    return Grammar(text, grammar.triggers)


def _response_schema(response_format: Mapping[str, Any] | None) -> Any:
    """The JSON schema ``response_format`` asks for, or ``None`` for text."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise RequestError(
            f"response_format.type must be text, json_object or json_schema; "
            f"got {str(kind)[:64]!r}",
            param="response_format",
        )
    spec = response_format.get("json_schema") or {}
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if schema is None:  # no schema given: any JSON value
        schema = {}
    return _as_schema(schema, "response_format", "response_format.json_schema.schema")


def _as_schema(schema: Any, param: str, where: str) -> Mapping[str, Any]:
    if schema is True:
        return {}
    if not isinstance(schema, Mapping):
        raise RequestError(
            f"{where} must be a JSON schema (an object); got {str(schema)[:64]!r}",
            param=param,
        )
    return schema


def _tool_choice(
    tool_choice: str | Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]]
) -> tuple[str, list[str]] | None:
    """``(mode, tool names)`` with mode ``auto``, ``required`` or ``named``; or
    ``None`` when no tool may be called."""
    names = [_tool_name(tool) for tool in tools]
    if not names or tool_choice == "none":
        return None
    if tool_choice is None or tool_choice in ("auto", "required"):
        return ("required" if tool_choice == "required" else "auto"), names
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if name in names:
            return "named", [str(name)]
        raise RequestError(
            f"tool_choice names the function {str(name)[:64]!r}, which is not "
            f"among the tools given",
            param="tool_choice",
        )
    raise RequestError(
        f"tool_choice must be none, auto, required or a function; "
        f"got {str(tool_choice)[:64]!r}",
        param="tool_choice",
    )


def _tool_name(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise RequestError("every tool needs a function.name", param="tools")
    return name


def _call_rules(tools: Sequence[Mapping[str, Any]], names: list[str]) -> list[str]:
    """The ``call`` rule: one alternative per callable tool, its arguments checked."""
    rules: list[str] = []
    alternatives: list[str] = []
    for i, tool in enumerate(tools):
        name = _tool_name(tool)
        if name not in names:
            continue
        where = f"the parameters of tool {name!r}"
        parameters = tool["function"].get("parameters")
        schema = _NO_ARGUMENTS if parameters is None else parameters
        schema = _as_schema(schema, "tools", where)
        args = _json_rule(schema)
        _check(args, "tools", where)
        head = '{"name": ' + json.dumps(name) + ', "arguments": '
        rules.append(f"call_{i}: {json.dumps(head)} args_{i} " + '"}"')
        rules.append(f"args_{i}: {args}")
        alternatives.append(f"call_{i}")
    return [f"call: {' | '.join(alternatives)}", *rules]


def _json_rule(schema: Mapping[str, Any]) -> str:
    """A ``%json`` rule body for ``schema``, in this module's JSON style, its
    objects closed (``closed_objects``)."""
    styled = {**closed_objects(schema), "x-guidance": _JSON_STYLE}
    return "%json " + json.dumps(styled, ensure_ascii=False)


# Keywords whose value is one subschema, and those whose value is a list or a
# name -> subschema map of them (JSON Schema 2020-12 and draft 7 spellings);
# ``not``, ``if``/``then``/``else`` and ``contains`` are refused by the grammar
# (and closing an object under ``not`` would widen it).
_ONE_SCHEMA = ("items", "additionalItems")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
# An object with one of these may hold keys its ``properties`` do not list.
_OPENS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed_objects(schema: Any) -> Any:
    """``schema`` with each object schema that lists ``properties`` and leaves
    its other keys unspecified given ``"additionalProperties": false``.

    Args:
        schema: a JSON schema (JSON values); not changed.

    Returns:
        A copy where changed, else the same values. Left as they are, with
        everything below them: a schema with ``allOf``, or with ``properties``
        next to ``anyOf`` or ``oneOf`` (closing one part would refuse the keys
        another adds), and an object whose ``required`` names a key its
        ``properties`` do not list (closed, it could never be written).
    """
    if not isinstance(schema, Mapping) or "allOf" in schema:
        return schema
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and ("anyOf" in schema or "oneOf" in schema):
        return schema
    out = dict(schema)
    for key in _ONE_SCHEMA:
        if key in out:
            out[key] = closed_objects(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: closed_objects(s) for k, s in out[key].items()}
    extra = out.get("additionalProperties")
    if isinstance(extra, Mapping):
        out["additionalProperties"] = closed_objects(extra)
    required = out.get("required", [])
    if (
        isinstance(properties, Mapping)
        and not any(k in out for k in _OPENS)
        and isinstance(required, list)
        and all(name in properties for name in required)
    ):
        out["additionalProperties"] = False
    return out


def _check(rule_or_grammar: str, param: str, where: str) -> None:
    """Compile it (a rule alone as a whole grammar); a 400 naming what failed."""
    # Imported here: llguidance, llama.cpp and numpy cost a server that never
    # checks a grammar (a gateway, the scripted engine) about 26 MiB and their
    # start-up; a llama.cpp server has them loaded already.
    from sluicegate.engines.llamacpp.grammar import unimplemented_keywords
    from sluicegate.server.prepare.grammar_check import grammar_errors

    text = rule_or_grammar
    if not text.startswith("%llguidance"):
        text = f"%llguidance {{}}\nstart: {rule_or_grammar}\n"
    errors = grammar_errors(text)
    if not errors:
        return
    keywords = [k for e in errors for k in unimplemented_keywords(e)]
    if keywords:
        listed = ", ".join(repr(k) for k in dict.fromkeys(keywords))
        raise RequestError(
            f"{where} uses the JSON-schema keyword(s) {listed}, which constrained "
            f"decoding cannot express",
            param=param,
            code="unsupported_schema",
        )
    first = errors[0].strip().splitlines()[0] if errors[0].strip() else "?"
    raise RequestError(
        f"{where} cannot be compiled into a grammar: {first[:_ERROR_CHARS]}",
        param=param,
        code="unsupported_schema",
    )
