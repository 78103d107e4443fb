"""Probes of tool calls and structured outputs: fragments, finishes, JSON, schemas.

Each probe is pure: a recording in, a ``ProbeResult`` out (see ``check.verdicts``).
The exchanges are ``check.names.TOOLS`` (one function, which ``tool_choice``
names, so the answer must call it), ``TOOLS_CUT`` (the same with too few tokens
for any call), ``SCHEMA`` (a ``json_schema`` ``response_format``), each streamed
and not, with the same body at temperature 0.

A server that declines the feature (a 4xx to ``tools`` or ``response_format``)
gets ``not-observable``, never a pass; any other answer than 200 is a fail.
Streamed calls are the client's assembly (``client.assemble``): fragments joined
by ``index``, complete and incomplete calls alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from sluicegate.check import names
from sluicegate.check.schemas import schema_errors
from sluicegate.check.semantics import assemble
from sluicegate.check.transcript import Transcript, json_body, parse
from sluicegate.check.verdicts import (
    ProbeResult,
    Verdict,
    choice_deltas,
    clip,
    fail,
    not_observable,
    passed,
)

__all__ = [
    "structured_output",
    "tool_arguments_valid",
    "tool_call_deltas",
    "tool_call_finish",
    "tool_calls_agree",
]

Call = tuple[str, str]
"""One call as ``(function name, arguments text)``."""
NO_CALL = "neither answer made a call"


def _exchanges(
    recording: Mapping[str, Transcript], *keys: str
) -> list[Transcript] | ProbeResult:
    """The exchanges ``keys``, or the verdict when they cannot all be graded."""
    missing = [k for k in keys if k not in recording]
    if missing:
        return not_observable(f"not recorded: {', '.join(missing)}")
    for key in keys:
        t = recording[key]
        if t.status is not None and 400 <= t.status < 500:
            return not_observable(
                f"{key} declined with {t.status}: {clip(t.body, 100)}"
            )
        if t.status != 200:
            return fail(f"{key} answered {t.status}: {clip(t.body, 120)}")
    return [recording[k] for k in keys]


def _choice(t: Transcript) -> tuple[Mapping[str, Any], str | None]:
    """A non-streamed answer's choice-0 message and finish reason."""
    body = json_body(t)
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return {}, None
    message = choice.get("message")
    return (message if isinstance(message, dict) else {}), choice.get("finish_reason")


def _plain_calls(t: Transcript) -> list[Call]:
    calls = _choice(t)[0].get("tool_calls")
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append((str(function.get("name")), str(function.get("arguments"))))
    return out


def _streamed_calls(t: Transcript) -> list[Call]:
    choices = assemble(t).choices
    if not choices:
        return []
    every = choices[0].tool_calls + choices[0].incomplete_tool_calls
    return [(c.name, c.arguments) for c in sorted(every, key=lambda c: c.index)]


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, orjson.loads(text)
    except orjson.JSONDecodeError:
        return False, None


def _same_call(a: Call, b: Call) -> bool:
    if a == b:
        return True
    (ok_a, value_a), (ok_b, value_b) = _loads(a[1]), _loads(b[1])
    return a[0] == b[0] and ok_a and ok_b and value_a == value_b


def tool_calls_agree(recording: Mapping[str, Transcript]) -> ProbeResult:
    """The streamed calls, assembled, equal the non-streamed ones at temperature
    0: the same functions in the same order, with the same arguments.

    Arguments are compared as text, or, where the texts differ, as parsed JSON
    values (key order and spacing aside); the evidence says which held.

    Spec: OpenAI API reference, "Function calling" and "The chat completion
    chunk object" (``delta.tool_calls``).
    """
    got = _exchanges(recording, names.TOOLS, names.TOOLS_PLAIN)
    if isinstance(got, ProbeResult):
        return got
    streamed, whole = _streamed_calls(got[0]), _plain_calls(got[1])
    if not streamed and not whole:
        return not_observable(NO_CALL)
    if len(streamed) != len(whole) or not all(map(_same_call, streamed, whole)):
        return fail(f"streamed {clip(streamed, 70)} != non-streamed {clip(whole, 70)}")
    how = "byte for byte" if streamed == whole else "as parsed JSON"
    return passed(f"{len(whole)} call(s) equal {how}: {clip(whole, 80)}")


def tool_call_deltas(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A streamed call's first fragment carries its ``index``, ``id``, ``type``
    ``"function"`` and ``function.name``; later fragments only ``index`` and
    ``function.arguments``; indexes count from 0 in order, ids are distinct.

    A key whose value is ``null`` counts as absent.

    Spec: OpenAI API reference, "The chat completion chunk object"
    (``delta.tool_calls``) and "Function calling" (streaming).
    """
    seen = 0
    for key in (names.TOOLS, names.TOOLS_CUT):
        got = _exchanges(recording, key)
        if isinstance(got, ProbeResult):
            if got.verdict is Verdict.FAIL:
                return got
            continue  # missing or declined: nothing to see
        for index, items in choice_deltas(parse(got[0])).items():
            fragments = [
                (pos, call)
                for pos, choice in items
                for call in _fragments(choice.get("delta"))
            ]
            seen += len(fragments)
            problem = _fragment_problem(fragments)
            if problem:
                return fail(f"{key}: choice {index}, {problem}")
    return passed(f"{seen} fragments") if seen else not_observable("no call streamed")


def _fragments(delta: Any) -> list[Any]:
    calls = delta.get("tool_calls") if isinstance(delta, dict) else None
    return calls if isinstance(calls, list) else []


def _fragment_problem(fragments: Sequence[tuple[int, Any]]) -> str | None:
    """What is wrong with one choice's call fragments, in order; else ``None``."""
    ids: set[str] = set()
    count = 0  # calls begun so far: the next new index must be this
    for pos, call in fragments:
        if not isinstance(call, dict) or not isinstance(call.get("index"), int):
            return f"#{pos}: a fragment without an integer index: {clip(call)}"
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        args = function.get("arguments")
        if args is not None and not isinstance(args, str):
            return f"#{pos}: arguments are not a string: {clip(args)}"
        heads = {"id": call.get("id"), "type": call.get("type")}
        heads["name"] = function.get("name")
        sent = {k for k, v in heads.items() if v is not None}
        if call["index"] == count:  # the first fragment of a new call
            count += 1
            if sent != set(heads) or heads["type"] != "function" or not heads["name"]:
                return f"#{pos}: a call starts without id, type or name: {clip(call)}"
            if heads["id"] in ids:
                return f"#{pos}: id {heads['id']!r} again"
            ids.add(str(heads["id"]))
        elif call["index"] > count:
            return f"#{pos}: index {call['index']} before index {count}"
        elif sent:
            return f"#{pos}: {', '.join(sorted(sent))} sent again: {clip(call)}"
    return None


def tool_call_finish(recording: Mapping[str, Transcript]) -> ProbeResult:
    """An answer that calls finishes ``tool_calls``, or ``length`` when
    ``max_tokens`` cut it (a cut call never finishes ``tool_calls``); the call
    ``tool_choice`` asks for is made, with no text (``content: null`` when not
    streamed).

    An answer that ``max_tokens`` cut inside its reasoning, before any call or
    text (a thinking model: reasoning, then ``finish_reason`` ``length``, no
    content but ``""``), shows none of this: it is not judged, and when neither
    answer can be, the verdict is not-observable. The cut exchanges are judged
    either way.

    Spec: OpenAI API reference, "Create chat completion" (``tool_choice``),
    "The chat completion object" (``finish_reason``, ``message.content``) and
    "Function calling".
    """
    got = _exchanges(
        recording,
        names.TOOLS,
        names.TOOLS_PLAIN,
        names.TOOLS_CUT,
        names.TOOLS_CUT_PLAIN,
    )
    if isinstance(got, ProbeResult):
        return got
    stream, whole, cut, cut_whole = got
    for key, finish in (
        (names.TOOLS_CUT, assemble(cut).finish_reason),
        (names.TOOLS_CUT_PLAIN, _choice(cut_whole)[1]),
    ):
        if finish != "length":
            limit = cut.request.get("max_tokens")
            return fail(f"{key}: finish_reason {finish!r} with max_tokens {limit}")
    result = assemble(stream)
    message, reason = _choice(whole)
    thought = result.choices[0].reasoning if result.choices else ""
    answers = [  # streamed: no text at all; not streamed: content null
        (
            names.TOOLS,
            result.finish_reason,
            _streamed_calls(stream),
            result.text or None,
            thought,
        ),
        (
            names.TOOLS_PLAIN,
            reason,
            _plain_calls(whole),
            message.get("content"),
            _plain_reasoning(message),
        ),
    ]
    judged = []
    for key, finish, calls, text, reasoning in answers:
        if not calls and not text and reasoning and finish == "length":
            continue  # cut while it reasoned: no call, no text to judge yet
        if not calls and finish != "length":
            return fail(f"{key}: no call, though tool_choice names one ({finish!r})")
        if finish not in ("tool_calls", "length"):
            return fail(f"{key}: finish_reason {finish!r} after {clip(calls, 80)}")
        if text is not None:
            return fail(f"{key}: content beside the call: {clip(text, 80)}")
        judged.append(f"{key}: {finish}")
    if not judged:
        return not_observable(
            "both answers were cut by max_tokens inside their reasoning, before"
            " any call (raise the exchanges' max_tokens to see one)"
        )
    return passed(f"{'; '.join(judged)}; cut: length / length")


def _plain_reasoning(message: Mapping[str, Any]) -> str:
    """A non-streamed message's reasoning (``reasoning_content``, else
    ``reasoning``), ``""`` for none."""
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def tool_arguments_valid(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Every call, streamed (assembled) and not, names a function the request
    offered, and its arguments are one whole JSON object that matches the
    function's ``parameters`` schema.

    The schema check covers the keywords ``check.schemas`` lists (types,
    required keys, enums, extra properties).

    Spec: OpenAI API reference, "Function calling" (``arguments``: "a JSON
    string"; strict schemas) and "Create chat completion" (``tools``).
    """
    got = _exchanges(recording, names.TOOLS, names.TOOLS_PLAIN)
    if isinstance(got, ProbeResult):
        return got
    stream, whole = got
    offered = _parameters(stream.request)
    seen = 0
    for key, calls in (
        (names.TOOLS, _streamed_calls(stream)),
        (names.TOOLS_PLAIN, _plain_calls(whole)),
    ):
        for name, arguments in calls:
            seen += 1
            if name not in offered:
                return fail(f"{key}: {name!r} is not an offered function")
            ok, value = _loads(arguments)
            if not ok or not isinstance(value, dict):
                return fail(
                    f"{key}: {name} arguments are not a JSON object: {clip(arguments)}"
                )
            errors = schema_errors(value, offered[name])
            if errors:
                return fail(f"{key}: {name} {clip(arguments, 60)}: {'; '.join(errors)}")
    return passed(f"{seen} calls valid") if seen else not_observable(NO_CALL)


def _parameters(request: Mapping[str, Any]) -> dict[str, Any]:
    """``{function name: parameters schema}`` of the request's tools."""
    out: dict[str, Any] = {}
    for tool in request.get("tools") or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters", True)
    return out


def structured_output(recording: Mapping[str, Transcript]) -> ProbeResult:
    """With a ``json_schema`` ``response_format``, the content, streamed
    (joined) and not, is one JSON value that matches the schema.

    An answer cut by ``max_tokens`` (finish ``length``) cannot be judged: it is
    ``not-observable``. The schema check covers the keywords ``check.schemas``
    lists.

    Spec: OpenAI API reference, "Structured Outputs" and "Create chat
    completion" (``response_format``).
    """
    got = _exchanges(recording, names.SCHEMA, names.SCHEMA_PLAIN)
    if isinstance(got, ProbeResult):
        return got
    stream, whole = got
    result = assemble(stream)
    message, reason = _choice(whole)
    answers = (
        (names.SCHEMA, result.text, result.finish_reason),
        (names.SCHEMA_PLAIN, message.get("content"), reason),
    )
    if any(finish == "length" for _, _, finish in answers):
        return not_observable("cut by max_tokens (finish_reason length)")
    response_format = stream.request.get("response_format") or {}
    schema = (response_format.get("json_schema") or {}).get("schema", True)
    for key, text, _ in answers:
        ok, value = _loads(text) if isinstance(text, str) else (False, None)
        if not ok:
            return fail(f"{key}: the content is not JSON: {clip(text)}")
        errors = schema_errors(value, schema)
        if errors:
            return fail(f"{key}: {clip(text, 60)}: {'; '.join(errors)}")
    return passed(f"both match the schema: {clip(answers[1][1], 80)}")
