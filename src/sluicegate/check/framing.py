"""Probes of the stream's shape: headers, framing, chunk order, the terminator.

Each probe is pure: a recording in, a ``ProbeResult`` out (see ``check.verdicts``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.check.transcript import Transcript
from sluicegate.check.verdicts import (
    ProbeResult,
    choice_deltas,
    clip,
    fail,
    not_observable,
    passed,
    streams,
    text_of,
)
from sluicegate.client.assemble import StreamAssembler

__all__ = [
    "anti_buffering",
    "content_type",
    "done_once_last",
    "end_states",
    "finish_reason_once",
    "framing",
    "not_cumulative",
    "role_first",
    "same_ids",
]

ALLOWED_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter"})
NONE_YET = "no streamed exchange answered 200"


def content_type(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A stream is answered with ``Content-Type: text/event-stream``.

    Spec: WHATWG HTML, "9.2 Server-sent events" (the MIME type); OpenAI API
    reference, "Streaming".
    """
    seen = 0
    for name, t, _ in streams(recording, complete=False):
        seen += 1
        value = t.headers.get("content-type", "")
        if value.split(";")[0].strip().lower() != "text/event-stream":
            return fail(f"{name}: content-type {value!r}")
    return passed(f"{seen} streams") if seen else not_observable(NONE_YET)


def anti_buffering(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Streams say ``Cache-Control: no-cache`` (or ``no-store``) and
    ``X-Accel-Buffering: no``, and are not compressed, so proxies pass each event
    on at once.

    Spec: docs/DESIGN.md, "The wire"; nginx ``proxy_buffering`` docs
    (``X-Accel-Buffering``).
    """
    seen = 0
    for name, t, _ in streams(recording, complete=False):
        seen += 1
        cache = t.headers.get("cache-control", "").lower()
        problems = []
        if "no-cache" not in cache and "no-store" not in cache:
            problems.append(f"cache-control {cache!r}")
        if t.headers.get("x-accel-buffering", "").lower() != "no":
            problems.append("no x-accel-buffering: no")
        if t.headers.get("content-encoding", "identity") != "identity":
            problems.append(f"content-encoding {t.headers['content-encoding']!r}")
        if problems:
            return fail(f"{name}: {', '.join(problems)}")
    return passed(f"{seen} streams") if seen else not_observable(NONE_YET)


def framing(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Every event is a ``data:`` line holding a JSON object or ``[DONE]``, in
    valid UTF-8, and the body does not end inside an event.

    Spec: WHATWG HTML, "9.2.6 Interpreting an event stream"; OpenAI API
    reference, "Streaming".
    """
    seen = 0
    for name, _, parsed in streams(recording):
        seen += len(parsed.data)
        if parsed.decode_error is not None:
            return fail(f"{name}: {parsed.decode_error}")
        if parsed.cut:
            return fail(f"{name}: the body ends inside an event")
        objects = {pos for pos, _ in parsed.chunks}
        for pos, data in enumerate(parsed.data):
            if data != "[DONE]" and pos not in objects:
                return fail(f"{name}: event #{pos} is not a JSON object: {clip(data)}")
            if parsed.event_types[pos] != "message":
                return fail(
                    f"{name}: event #{pos} has event: {parsed.event_types[pos]}"
                )
    return passed(f"{seen} events") if seen else not_observable(NONE_YET)


def role_first(recording: Mapping[str, Transcript]) -> ProbeResult:
    """In a chat stream, each choice's first delta is ``{"role": "assistant"}``.

    Spec: OpenAI API reference, "The chat completion chunk object"
    (``delta.role``); docs/DESIGN.md, "The wire".
    """
    seen = 0
    for name, t, parsed in streams(recording):
        if t.path != "chat/completions":
            continue
        for index, items in choice_deltas(parsed).items():
            seen += 1
            pos, first = items[0]
            delta = first.get("delta")
            role = delta.get("role") if isinstance(delta, dict) else None
            if role != "assistant":
                return fail(f"{name}: choice {index} starts at #{pos}: {clip(first)}")
    return passed(f"{seen} choices") if seen else not_observable(NONE_YET)


def not_cumulative(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Each delta carries only new text, never the text so far repeated.

    A delta that starts with everything before it, or with the previous delta
    and is longer (at least 2 chars before), is counted; two such deltas in one
    choice is a fail.

    Spec: OpenAI API reference, "The chat completion chunk object" (``delta``).
    """
    seen = 0
    for name, _, parsed in streams(recording):
        for index, items in choice_deltas(parsed).items():
            so_far, previous, repeats = "", "", 0
            for pos, choice in items:
                text = text_of(choice)
                seen += bool(text)
                grows = len(text) > len(previous) and text.startswith(previous)
                again = len(so_far) >= 2 and text.startswith(so_far)
                if again or (len(previous) >= 2 and grows):
                    repeats += 1
                    if repeats == 2:
                        return fail(
                            f"{name}: choice {index}, #{pos} repeats the text so "
                            f"far: {clip(text)}"
                        )
                so_far += text
                previous = text or previous
    return passed(f"{seen} deltas") if seen else not_observable("no text deltas")


def finish_reason_once(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Each choice gets exactly one non-null ``finish_reason``, from the allowed
    set, and no text after it.

    Spec: OpenAI API reference, "The chat completion chunk object"
    (``finish_reason``: stop, length, tool_calls, content_filter).
    """
    seen = 0
    for name, _, parsed in streams(recording):
        if any(isinstance(c.get("error"), dict) for _, c in parsed.chunks):
            continue  # an errored stream ends without finish reasons
        for index, items in choice_deltas(parsed).items():
            seen += 1
            ends = [(p, c["finish_reason"]) for p, c in items if c.get("finish_reason")]
            ends += [(p, "") for p, c in items if c.get("finish_reason") == ""]
            if len(ends) != 1:
                return fail(f"{name}: choice {index} has finish reasons {ends!r}")
            pos, reason = ends[0]
            if reason not in ALLOWED_FINISH:
                return fail(f"{name}: choice {index}, #{pos}: {reason!r}")
            late = [p for p, c in items if p > pos and text_of(c)]
            if late:
                return fail(
                    f"{name}: choice {index} has text at #{late[0]} after finish"
                )
    return passed(f"{seen} choices") if seen else not_observable(NONE_YET)


def done_once_last(recording: Mapping[str, Transcript]) -> ProbeResult:
    """A stream that did not fail ends with exactly one ``data: [DONE]``; a
    failed one sends its error event and no ``[DONE]``.

    Spec: OpenAI API reference, "Streaming"; docs/DESIGN.md, "Status first,
    errors in band".
    """
    seen = 0
    for name, _, parsed in streams(recording):
        seen += 1
        count = parsed.data.count("[DONE]")
        errored = any(isinstance(c.get("error"), dict) for _, c in parsed.chunks)
        if errored and count:
            return fail(f"{name}: [DONE] after an in-band error")
        if not errored and count != 1:
            return fail(f"{name}: {count} [DONE] events")
        if count and parsed.data[-1] != "[DONE]":
            return fail(f"{name}: after [DONE] came {clip(parsed.data[-1])}")
    return passed(f"{seen} streams") if seen else not_observable(NONE_YET)


def same_ids(recording: Mapping[str, Transcript]) -> ProbeResult:
    """``id``, ``created`` and ``model`` are the same on every chunk of a stream.

    Spec: OpenAI API reference, "The chat completion chunk object" ("each chunk
    has the same ID"); docs/DESIGN.md, "The wire".
    """
    seen = 0
    for name, _, parsed in streams(recording):
        firsts: dict[str, object] = {}
        for pos, chunk in parsed.chunks:
            if "error" in chunk:
                continue
            seen += 1
            for key in ("id", "created", "model"):
                value = firsts.setdefault(key, chunk.get(key))
                if chunk.get(key) != value:
                    return fail(f"{name}: #{pos} {key} {chunk.get(key)!r} != {value!r}")
    return passed(f"{seen} chunks") if seen else not_observable(NONE_YET)


def end_states(recording: Mapping[str, Transcript]) -> ProbeResult:
    """Every stream the recorder read to its end is ``finished`` by the shared
    classification (a finish per choice, then ``[DONE]``).

    Spec: docs/DESIGN.md, "End states".
    """
    seen = 0
    for name, t, _ in streams(recording):
        seen += 1
        assembler = StreamAssembler(int(t.request.get("n") or 1))
        assembler.head(t.status or 0, t.headers, 0.0)
        assembler.feed(t.body, 0.0)
        result = assembler.flush(t.elapsed_s)
        if result.end_state != "finished":
            why = result.protocol_error or result.error or "no finish or [DONE]"
            return fail(f"{name}: {result.end_state}: {clip(why)}")
    return passed(f"{seen} streams finished") if seen else not_observable(NONE_YET)
