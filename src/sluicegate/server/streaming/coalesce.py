"""Deltas that piled up for a slow client, merged: one per choice and kind.

``coalesce(events)`` is what ``StreamBuffer.drain()`` (``buffer.py``) does to the
events queued while the client's socket was behind: each run of a choice's
deltas of one kind of output (content, reasoning, tool calls) becomes one
``Delta`` (``join_all_deltas``); finishes, ends, failures and heartbeats stay
where they were and end the runs before them.

Invariants:
    - Per choice, text order is kept and every ``Delta`` stays before that
      choice's ``Finish``.
    - A merged ``Delta`` carries one kind of output, unless one ``Delta`` given
      carried several: the reasoning reaches the client in chunks of its own,
      before the content's, however far behind it was.

Spec: docs/DESIGN.md, "Slow consumers" and "Reasoning".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluicegate.core.events import (
    Delta,
    Finish,
    StreamEvent,
    join_all_parts,
    join_parts,
)

__all__ = ["coalesce", "join_all_deltas", "join_deltas"]


def join_deltas(first: Delta, second: Delta) -> Delta:
    """One ``Delta`` saying what ``first`` then ``second`` say (same choice).

    Generic over ``Delta``'s fields, so fields added later join too: strings and
    tuples (text, logprobs) concatenate; ``parts`` join part by part
    (``join_parts``: reasoning concatenates, tool-call arguments concatenate per
    tool-call index, never across indexes); any other field (a running snapshot
    such as the usage so far) takes ``second``'s value unless that is ``None``.

    Raises:
        ValueError: the two deltas belong to different choices.
    """
    if first.index != second.index:
        raise ValueError(
            f"expected deltas of one choice, got {first.index!r} and {second.index!r}"
        )
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(first):
        a, b = getattr(first, field.name), getattr(second, field.name)
        if type(a) is type(b) and isinstance(a, str | tuple):
            changes[field.name] = a + b
        elif field.name == "parts":
            changes[field.name] = join_parts(a, b)
        elif field.name != "index":
            changes[field.name] = a if b is None else b
    return dataclasses.replace(first, **changes)


def join_all_deltas(deltas: list[Delta]) -> Delta:
    """``join_deltas`` folded over ``deltas`` (one choice, >= 1), in time linear
    in their text, logprobs and tool-call fragments (folding pairwise copies
    what was joined so far at every step: quadratic).

    Raises:
        ValueError: the deltas belong to different choices.
    """
    first = deltas[0]
    if len(deltas) == 1:
        return first
    if any(d.index != first.index for d in deltas):
        raise ValueError(f"expected deltas of one choice, got {deltas!r:.200}")
    logprobs = [d.logprobs for d in deltas if d.logprobs is not None]
    usage = first.usage
    for delta in deltas:
        if delta.usage is not None:
            usage = delta.usage
    return Delta(
        first.index,
        "".join(d.text for d in deltas),
        tuple(t for chunk in logprobs for t in chunk) if logprobs else None,
        usage,
        join_all_parts([d.parts for d in deltas]),
    )


def coalesce(events: list[StreamEvent]) -> tuple[list[StreamEvent], int]:
    """Merge each choice's pending deltas of one kind into one; returns (events,
    merged count).

    A ``Delta`` joins the earlier ``Delta`` of its choice in ``events`` unless that
    choice's ``Finish`` came between (it cannot, for a well-formed generation), an
    ``End``/``Fail``/``Heartbeat`` did, or the two carry different kinds of
    output (content, reasoning, tool calls): reasoning then
    content stay two deltas, so the client gets the reasoning in chunks of its
    own, before the content's (docs/DESIGN.md, "Reasoning"), however far behind
    it was. A delta that carries nothing (a usage snapshot) joins any kind.
    ``merged`` counts the deltas that were folded into another (0 when nothing
    piled up). Linear in the events: each run of a choice's deltas is joined
    once (``join_all_deltas``).
    """
    out: list[StreamEvent | list[Delta]] = []
    open_at: dict[int, tuple[int, int]] = {}  # choice -> (its run in out, kind)
    merged = 0
    for event in events:
        if isinstance(event, Delta):
            kind = _kind(event)
            run = open_at.get(event.index)
            if run is not None and (not kind or not run[1] or kind == run[1]):
                joined = out[run[0]]
                assert isinstance(joined, list)
                joined.append(event)
                merged += 1
                if not run[1]:
                    open_at[event.index] = (run[0], kind)
                continue
            open_at[event.index] = (len(out), kind)
            out.append([event])
            continue
        if isinstance(event, Finish):
            open_at.pop(event.index, None)
        else:
            open_at.clear()
        out.append(event)
    joined_all = [join_all_deltas(e) if isinstance(e, list) else e for e in out]
    return joined_all, merged


_CONTENT, _REASONING, _TOOL_CALLS = 1, 2, 4


def _kind(delta: Delta) -> int:
    """What ``delta`` carries, as bits: content (text or logprobs), reasoning,
    tool calls; 0 for none of them (a usage snapshot)."""
    kind = _CONTENT if delta.text or delta.logprobs else 0
    parts = delta.parts
    if parts is not None:
        if parts.reasoning:
            kind |= _REASONING
        if parts.tool_calls:
            kind |= _TOOL_CALLS
    return kind
