"""Shared helpers of the Responses and Messages probes: typed event streams.

Both APIs name each event twice, in the SSE ``event`` field and in the JSON
``type``; the helpers here read a recorded exchange as ``[(type, object)]`` and
grade the missing-API case (an answer of 404) as ``not-observable``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sluicegate.check.transcript import Transcript, json_body, parse
from sluicegate.check.verdicts import ProbeResult, fail, not_observable, passed

__all__ = [
    "Events",
    "content_type",
    "each_stream",
    "error_object",
    "events_of",
    "streams_of",
    "unavailable",
]

Events = list[tuple[str, Mapping[str, Any]]]
"""``[(type, event object)]`` in stream order."""


def events_of(t: Transcript) -> tuple[Events, str | None]:
    """The typed events of a streamed body, and the first framing problem.

    Returns:
        ``(events, problem)``: ``problem`` is ``None`` when every event is a
        JSON object whose ``type`` equals its SSE ``event`` field.
    """
    parsed = parse(t)
    if parsed.decode_error or parsed.cut:
        return [], parsed.decode_error or "the body ends inside an event"
    objects = dict(parsed.chunks)
    events: Events = []
    for pos, (name, data) in enumerate(
        zip(parsed.event_types, parsed.data, strict=True)
    ):
        obj = objects.get(pos)
        if obj is None or obj.get("type") != name:
            return events, f"event {pos} ({name}) has data {data[:80]!r}"
        events.append((name, obj))
    return events, None


def unavailable(recording: Mapping[str, Transcript], name: str) -> ProbeResult | None:
    """``not-observable`` if ``name`` is unrecorded or answered 404, else ``None``."""
    t = recording.get(name)
    if t is None:
        return not_observable(f"{name} was not recorded")
    if t.status == 404:
        return not_observable(f"{t.path} answered 404 (no such API)")
    if t.status is None:
        return not_observable(f"{name} got no answer")
    return None


def content_type(recording: Mapping[str, Transcript], name: str) -> ProbeResult:
    """``name``'s stream is answered with ``Content-Type: text/event-stream``
    (``not-observable`` as ``unavailable`` says).

    Spec: WHATWG HTML, "9.2 Server-sent events" (the MIME type).
    """
    missing = unavailable(recording, name)
    if missing:
        return missing
    kind = recording[name].headers.get("content-type", "")
    if kind.split(";")[0].strip() != "text/event-stream":
        return fail(f"content-type {kind!r} (status {recording[name].status})")
    return passed(kind)


def streams_of(
    recording: Mapping[str, Transcript], names: tuple[str, ...]
) -> Iterator[tuple[str, Events, str | None]]:
    """Each named exchange streamed with status 200, in ``names`` order: its
    name, its typed events and their first framing problem (``events_of``)."""
    for name in names:
        t = recording.get(name)
        if t is not None and t.status == 200 and t.streamed:
            events, problem = events_of(t)
            yield name, events, problem


def each_stream(
    recording: Mapping[str, Transcript],
    names: tuple[str, ...],
    judge: Callable[[Events], str | None],
) -> ProbeResult:
    """Apply ``judge`` (a problem or ``None``) to each named 200 stream.

    Spec: WHATWG HTML, "9.2.6 Interpreting an event stream".
    """
    judged = 0
    for name, events, problem in streams_of(recording, names):
        problem = problem or judge(events)
        if problem:
            return fail(f"{name}: {problem}")
        judged += 1
    if not judged:
        first = unavailable(recording, names[0]) if names else None
        return first or not_observable("no stream answered 200")
    return passed(f"{judged} streams")


def error_object(t: Transcript) -> Mapping[str, Any] | None:
    """The ``error`` object of a JSON error body, or ``None``."""
    body = json_body(t)
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None
