"""Probes of ``POST /v1/responses`` streams (OpenAI Responses API).

Each probe is pure: a recording in, a ``ProbeResult`` out; exchanges are named
``responses_*`` (see ``check.record_events``). A server without the API (404)
grades ``not-observable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.check.event_streams import (
    Events,
    each_stream,
    error_object,
    events_of,
    unavailable,
)
from sluicegate.check.shared_probes import EventApi, shared_probes
from sluicegate.check.transcript import Transcript, json_body
from sluicegate.check.verdicts import ProbeResult, clip, fail, passed

__all__ = [
    "responses_content_type",
    "responses_echo",
    "responses_event_order",
    "responses_matches_plain",
    "responses_max_tokens",
    "responses_rejects_invalid",
    "responses_sequence_numbers",
    "responses_usage",
]

STREAM = "responses_stream"
PLAIN = "responses_plain"
MAX = "responses_max"
INVALID = "responses_invalid"
ECHO = "responses_echo"
ECHO_TOOL = {
    "type": "function",
    "name": "sluicegate_check_echo",
    "description": "Never needed: the request's tool_choice is none.",
    "parameters": {"type": "object", "properties": {}},
}
"""The one tool the ``responses_echo`` exchange offers."""
STREAMS = (STREAM, MAX)
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_OPENS = {
    "response.output_text.delta": "response.content_part.added",
    "response.content_part.added": "response.output_item.added",
}


def _order(events: Events) -> str | None:
    types = [name for name, _ in events]
    if types[:2] != ["response.created", "response.in_progress"]:
        return f"starts with {types[:2]}"
    ends = [i for i, name in enumerate(types) if name in TERMINAL]
    if len(ends) != 1 or ends[0] != len(types) - 1:
        return f"terminal events at {ends} of {len(types)}"
    for i, name in enumerate(types):
        opener = _OPENS.get(name)
        if opener and opener not in types[:i]:
            return f"{name} at {i} before {opener}"
    return None


def _sequence(events: Events) -> str | None:
    numbers = [obj.get("sequence_number") for _, obj in events]
    if numbers != list(range(len(numbers))):
        return f"sequence_number {clip(numbers)}"
    return None


def responses_sequence_numbers(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Every event's ``sequence_number`` counts from 0 by one.

    Spec: OpenAI API reference, "Responses: streaming events".
    """
    return each_stream(recording, STREAMS, _sequence)


def _final(t: Transcript) -> Mapping[str, Any]:
    events, _ = events_of(t)
    last = events[-1][1].get("response") if events else None
    return last if isinstance(last, dict) else {}


def _usage_problem(usage: Any) -> str | None:
    if not isinstance(usage, dict):
        return f"usage {clip(usage)}"
    keys = ("input_tokens", "output_tokens", "total_tokens")
    parts = [v for v in (usage.get(k) for k in keys) if isinstance(v, int)]
    if len(parts) != 3 or parts[0] + parts[1] != parts[2]:
        return f"usage {clip(usage)}: total != input + output"
    return None


def responses_usage(recording: Mapping[str, Transcript]) -> ProbeResult:
    """The terminal response carries usage with total = input + output tokens.

    Spec: OpenAI API reference, "Responses: the response object, usage".
    """
    missing = unavailable(recording, STREAM)
    if missing:
        return missing
    usage = _final(recording[STREAM]).get("usage")
    problem = _usage_problem(usage)
    return fail(problem) if problem else passed(clip(usage))


def _plain_text(body: Any) -> tuple[str] | None:
    """The text of a non-streamed response's message items (what the stream's
    ``response.output_text.delta`` events carry; a reasoning item's
    ``reasoning_text`` is not part of it)."""
    if not isinstance(body, dict) or not isinstance(body.get("output"), list):
        return None
    return ("".join(
        str(part.get("text", ""))
        for item in body["output"]
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    ),)  # fmt: skip


def streamed_text(t: Transcript) -> str:
    """The concatenated ``response.output_text.delta`` texts of a stream."""
    events, _ = events_of(t)
    deltas = (o.get("delta") for n, o in events if n == "response.output_text.delta")
    return "".join(d for d in deltas if isinstance(d, str))


RESPONSES = EventApi(
    name="responses",
    title="Responses",
    stream=STREAM,
    plain=PLAIN,
    streams=STREAMS,
    order=_order,
    answer=lambda t: (streamed_text(t),),
    plain_answer=_plain_text,
    content_type_spec='OpenAI API reference, "Responses: streaming events".',
    order_rule="Typed events: created, in_progress, items and parts opened before "
    "their deltas, and exactly one terminal event, last.",
    order_spec='OpenAI API reference, "Responses: streaming events".',
    plain_rule="At temperature 0 the streamed text equals the non-streamed "
    "``output`` text.",
    plain_spec='OpenAI API reference, "Responses: create a response".',
)
"""What the probes shared with the Messages API read of this one."""
responses_content_type, responses_event_order, responses_matches_plain = shared_probes(
    RESPONSES
)


def responses_max_tokens(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A too-small ``max_output_tokens`` ends ``response.incomplete`` with
    reason ``max_output_tokens``.

    Spec: OpenAI API reference, "Responses: incomplete_details".
    """
    missing = unavailable(recording, MAX)
    if missing:
        return missing
    final = _final(recording[MAX])
    details = final.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if final.get("status") != "incomplete" or reason != "max_output_tokens":
        return fail(f"status {final.get('status')!r}, details {clip(details)}")
    return passed("incomplete: max_output_tokens")


def responses_rejects_invalid(recording: Mapping[str, Transcript]) -> ProbeResult:
    """An invalid request is a 400 before any stream, with an ``error`` object
    naming the parameter.

    Spec: OpenAI API reference, "Error codes".
    """
    missing = unavailable(recording, INVALID)
    if missing:
        return missing
    t = recording[INVALID]
    error = error_object(t)
    if t.status != 400 or error is None or not error.get("message"):
        return fail(f"status {t.status}, body {clip(t.body)}")
    return passed(f"400 param={error.get('param')!r}")


def responses_echo(recording: Mapping[str, Transcript]) -> ProbeResult:
    """The response object repeats the request's ``tool_choice``,
    ``parallel_tool_calls``, ``tools`` and ``metadata`` (not the defaults).

    Spec: OpenAI API reference, "Responses", "The response object".
    """
    missing = unavailable(recording, ECHO)
    if missing:
        return missing
    t = recording[ECHO]
    body = json_body(t)
    if t.status != 200 or not isinstance(body, dict):
        return fail(f"status {t.status}, body {clip(t.body)}")
    sent = t.request
    wrong = [
        f"{name} {clip(body.get(name))} (sent {clip(sent.get(name))})"
        for name in ("tool_choice", "parallel_tool_calls", "metadata")
        if body.get(name) != sent.get(name)
    ]
    tools = body.get("tools")
    names = (
        [x.get("name") for x in tools if isinstance(x, dict)]
        if isinstance(tools, list)
        else None
    )
    if names != [tool["name"] for tool in sent.get("tools", [])]:
        wrong.append(f"tools {clip(tools)}")
    if wrong:
        return fail("; ".join(wrong))
    return passed("tool_choice, parallel_tool_calls, tools and metadata repeated")
