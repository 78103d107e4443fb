"""Probes of ``POST /v1/messages`` streams (Anthropic Messages API).

Each probe is pure: a recording in, a ``ProbeResult`` out; exchanges are named
``messages_*`` (see ``check.record_events``). A server without the API (404)
grades ``not-observable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.check.event_streams import Events, events_of, unavailable
from sluicegate.check.shared_probes import Answer, EventApi, shared_probes
from sluicegate.check.transcript import Transcript, json_body
from sluicegate.check.verdicts import (
    ProbeResult,
    clip,
    fail,
    not_observable,
    passed,
)

__all__ = [
    "messages_content_type",
    "messages_event_order",
    "messages_matches_plain",
    "messages_max_tokens",
    "messages_rejects_invalid",
    "messages_stop_sequence",
    "messages_stop_sequences",
    "messages_usage",
]

STREAM = "messages_stream"
PLAIN = "messages_plain"
STOP = "messages_stop"
MAX = "messages_max"
INVALID = "messages_invalid"
STOPS = "messages_stops"
STOPS_PLAIN = "messages_stops_plain"
STREAMS = (STREAM, STOP, MAX, STOPS)
_BLOCK = ("content_block_start", "content_block_delta", "content_block_stop")


def _blocks(events: Events) -> str | None:
    state: dict[Any, str] = {}
    for i, (name, obj) in enumerate(events):
        if name not in _BLOCK:
            continue
        index, seen = obj.get("index"), state.get(obj.get("index"))
        if name == "content_block_start" and seen is None:
            state[index] = "open"
        elif name in _BLOCK[1:] and seen == "open":
            state[index] = "closed" if name == "content_block_stop" else "open"
        else:
            return f"{name} of block {index} at {i} when it is {seen or 'unopened'}"
    if "open" in state.values():
        return "a block is never closed"
    return None


def _order(events: Events) -> str | None:
    types = [name for name, _ in events if name != "ping"]
    if types[:1] != ["message_start"] or types[-2:] != [
        "message_delta",
        "message_stop",
    ]:
        return f"starts {types[:1]}, ends {types[-2:]}"
    if types.count("message_stop") != 1 or types.count("message_delta") != 1:
        return "message_delta and message_stop must come once each"
    return _blocks(events)


def _delta(t: Transcript) -> Mapping[str, Any]:
    events, _ = events_of(t)
    found = [obj for name, obj in events if name == "message_delta"]
    return found[-1] if found else {}


def messages_usage(recording: Mapping[str, Transcript]) -> ProbeResult:
    """message_start carries input usage: ``input_tokens`` (the prompt's,
    so at least 1 with the cache reads) and the two cache counts
    (``cache_creation_input_tokens``, ``cache_read_input_tokens``: required,
    null or a count); message_delta's cumulative ``usage.output_tokens`` is
    at least 1, and the input counts it repeats are message_start's (a prompt
    read from a cache is said alike at the start and at the end).

    Spec: Anthropic API, "Streaming Messages: event flow"; "Messages",
    ``usage``.
    """
    missing = unavailable(recording, STREAM)
    if missing:
        return missing
    events, _ = events_of(recording[STREAM])
    start = events[0][1].get("message") if events else None
    first = start.get("usage") if isinstance(start, dict) else None
    usage = _delta(recording[STREAM]).get("usage")
    out = usage.get("output_tokens") if isinstance(usage, dict) else None
    if not isinstance(first, dict) or not isinstance(first.get("input_tokens"), int):
        return fail(f"message_start usage {clip(first)}")
    cache = [first.get(f"cache_{k}_input_tokens", "") for k in ("creation", "read")]
    if not all(c is None or isinstance(c, int) for c in cache):
        return fail(f"message_start usage without its cache counts: {clip(first)}")
    if first["input_tokens"] + (cache[1] or 0) < 1:
        return fail(f"message_start usage says no prompt: {clip(first)}")
    if not isinstance(out, int) or out < 1:
        return fail(f"message_delta usage {clip(usage)}")
    assert isinstance(usage, dict)  # out is an int
    for key in ("input_tokens", "cache_read_input_tokens"):
        said = (first.get(key), usage.get(key))
        if all(isinstance(n, int) for n in said) and said[0] != said[1]:
            return fail(f"{key}: message_start {said[0]}, message_delta {said[1]}")
    return passed(f"input {first['input_tokens']}, output {out}")


def streamed_text(t: Transcript) -> str:
    """The concatenated ``text_delta`` texts of a stream."""
    events, _ = events_of(t)
    deltas = (o.get("delta") for n, o in events if n == "content_block_delta")
    return "".join(
        str(d.get("text", "")) for d in deltas
        if isinstance(d, dict) and d.get("type") == "text_delta"
    )  # fmt: skip


def _stop_reason(t: Transcript) -> Any:
    delta = _delta(t).get("delta")
    return delta.get("stop_reason") if isinstance(delta, dict) else None


def _plain_answer(body: Any) -> Answer | None:
    if not isinstance(body, dict) or not isinstance(body.get("content"), list):
        return None
    return plain_text(body), body.get("stop_reason")


MESSAGES = EventApi(
    name="messages",
    title="Messages",
    stream=STREAM,
    plain=PLAIN,
    streams=STREAMS,
    order=_order,
    answer=lambda t: (streamed_text(t), _stop_reason(t)),
    plain_answer=_plain_answer,
    content_type_spec='Anthropic API, "Streaming Messages".',
    order_rule="message_start first; blocks started before their deltas and "
    "stopped once; one message_delta then one message_stop, last.",
    order_spec='Anthropic API, "Streaming Messages: event flow".',
    plain_rule="At temperature 0 the streamed text and stop_reason equal the "
    "non-streamed message's.",
    plain_spec='Anthropic API, "Messages: create a message".',
)
"""What the probes shared with the Responses API read of this one."""
messages_content_type, messages_event_order, messages_matches_plain = shared_probes(
    MESSAGES
)


def messages_stop_sequence(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A matched stop sequence ends with stop_reason ``stop_sequence``, names
    it, and is not in the text.

    Spec: Anthropic API, "Messages: stop_sequences".
    """
    missing = unavailable(recording, STOP)
    if missing:
        return missing
    t = recording[STOP]
    stops = t.request.get("stop_sequences") or []
    delta = _delta(t).get("delta")
    delta = delta if isinstance(delta, dict) else {}
    text = streamed_text(t)
    if (
        delta.get("stop_reason") != "stop_sequence"
        or delta.get("stop_sequence") not in stops
    ):
        return fail(f"delta {clip(delta)} for stops {clip(stops)}")
    if any(s in text for s in stops):
        return fail(f"text {clip(text)} holds a stop sequence")
    return passed(f"stopped at {delta.get('stop_sequence')!r}")


def _first_met(text: str, stops: list[Any]) -> set[str]:
    """The stop strings whose first occurrence in ``text`` ends first."""
    ends = {s: text.find(s) + len(s) for s in stops if isinstance(s, str) and s in text}
    first = min(ends.values(), default=None)
    return {s for s, end in ends.items() if end == first}


def plain_text(body: Any) -> str:
    """The text of a non-streamed message body: its content blocks' ``text``,
    joined (``""`` for a body that is not a message)."""
    content = body.get("content") if isinstance(body, dict) else None
    blocks = content if isinstance(content, list) else []
    return "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def _plain_stop(t: Transcript) -> tuple[str, Any, Any]:
    body = json_body(t)
    body = body if isinstance(body, dict) else {}
    return plain_text(body), body.get("stop_reason"), body.get("stop_sequence")


def messages_stop_sequences(recording: Mapping[str, Transcript]) -> ProbeResult:
    """With several stop sequences, the answer streamed and not ends with
    stop_reason ``stop_sequence`` naming the one met first in the reference
    text (not merely the first one given), and leaves it out.

    Spec: Anthropic API, "Messages: stop_sequences", ``stop_sequence``.
    """
    missing = (
        unavailable(recording, PLAIN)
        or unavailable(recording, STOPS)
        or unavailable(recording, STOPS_PLAIN)
    )
    if missing:
        return missing
    reference, _, _ = _plain_stop(recording[PLAIN])
    stops = list(recording[STOPS].request.get("stop_sequences") or [])
    want = _first_met(reference, stops)
    if not want:
        return not_observable(f"no stop of {clip(stops)} occurs in the reference")
    delta = _delta(recording[STOPS]).get("delta")
    delta = delta if isinstance(delta, dict) else {}
    answers = {
        STOPS: (streamed_text(recording[STOPS]), delta.get("stop_reason"),
                delta.get("stop_sequence")),
        STOPS_PLAIN: _plain_stop(recording[STOPS_PLAIN]),
    }  # fmt: skip
    for name, (text, reason, met) in answers.items():
        if recording[name].status != 200:
            return fail(f"{name} answered {recording[name].status}")
        if reason != "stop_sequence" or met not in want:
            return fail(f"{name}: {reason!r}, {met!r}; {sorted(want)} is met first")
        if any(s in text for s in stops):
            return fail(f"{name}: text {clip(text)} holds a stop sequence")
    return passed(f"both name {sorted(want)[0]!r} of {len(stops)}")


def messages_max_tokens(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A too-small ``max_tokens`` ends with stop_reason ``max_tokens``.

    Spec: Anthropic API, "Messages: stop_reason".
    """
    missing = unavailable(recording, MAX)
    if missing:
        return missing
    reason = _stop_reason(recording[MAX])
    return (
        passed("max_tokens")
        if reason == "max_tokens"
        else fail(f"stop_reason {reason!r}")
    )


def messages_rejects_invalid(recording: Mapping[str, Transcript]) -> ProbeResult:
    """An invalid request is a 400 before any stream, with body
    ``{"type": "error", "error": {"type", "message"}}``.

    Spec: Anthropic API, "Errors".
    """
    missing = unavailable(recording, INVALID)
    if missing:
        return missing
    t = recording[INVALID]
    body = json_body(t)
    error = body.get("error") if isinstance(body, dict) else None
    ok = isinstance(error, dict) and error.get("type") and error.get("message")
    if (
        t.status != 400
        or not isinstance(body, dict)
        or body.get("type") != "error"
        or not ok
    ):
        return fail(f"status {t.status}, body {clip(t.body)}")
    return passed(f"400 {error['type']}")  # type: ignore[index]
