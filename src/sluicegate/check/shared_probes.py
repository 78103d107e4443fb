"""The probes of the same shape on the Responses and Messages APIs, written once.

Both APIs' streams are typed events (``event_streams.py``); three of their
probes differ only in what they read: the content type, the event order, and
the streamed answer against the non-streamed one. ``shared_probes`` writes
those three for an API from its declaration, an ``EventApi`` (its exchanges,
its order judge, how its answer is read, its rules and their sources), with the
names and docstrings ``probes.describe`` reads, as if each were written out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluicegate.check.event_streams import (
    Events,
    content_type,
    each_stream,
    unavailable,
)
from sluicegate.check.transcript import Transcript, json_body
from sluicegate.check.verdicts import Probe, ProbeResult, clip, fail, passed

__all__ = ["Answer", "EventApi", "shared_probes"]


Answer = tuple[Any, ...]
"""What a streamed answer must share with the non-streamed one: its text
first, then what else the API reports of its end (Messages: ``stop_reason``)."""


@dataclass(frozen=True, slots=True)
class EventApi:
    """One typed-event API, as the probes both such APIs share read it.

    Attributes:
        name: the probes' name prefix (``responses``: ``responses_event_order``).
        title: the API in the rules' words (``Responses``).
        stream: the streamed exchange; ``plain``: the same request not streamed.
        streams: the streamed exchanges whose event order is graded.
        order: one stream's event-order problem, or ``None``.
        answer: a streamed exchange's ``Answer``.
        plain_answer: a non-streamed body's ``Answer``; ``None`` for a body
            that is not the API's object.
        content_type_spec: the content-type probe's ``Spec:`` source.
        order_rule: the event-order probe's rule; ``order_spec`` its source.
        plain_rule: the answer probe's rule; ``plain_spec`` its source.
    """

    name: str
    title: str
    stream: str
    plain: str
    streams: tuple[str, ...]
    order: Callable[[Events], str | None]
    answer: Callable[[Transcript], Answer]
    plain_answer: Callable[[Any], Answer | None]
    content_type_spec: str
    order_rule: str
    order_spec: str
    plain_rule: str
    plain_spec: str


def _named(name: str, rule: str, spec: str, probe: Probe) -> Probe:
    """``probe`` named ``name`` with the docstring ``describe`` reads (its rule,
    then its ``Spec:`` line)."""
    probe.__name__ = probe.__qualname__ = name
    probe.__doc__ = f"{rule}\n\nSpec: {spec}"
    return probe


def _shown(answer: Answer) -> str:
    return "/".join([clip(answer[0]), *(f"{part}" for part in answer[1:])])


def shared_probes(api: EventApi) -> tuple[Probe, Probe, Probe]:
    """``api``'s probes of the shape both typed-event APIs share:
    ``(<name>_content_type, <name>_event_order, <name>_matches_plain)``.

    The first: ``api.stream`` is answered with ``Content-Type:
    text/event-stream``. The second: ``api.order`` finds no problem in any of
    ``api.streams`` that answered 200 (``each_stream``). The third: at
    temperature 0, ``api.stream``'s answer equals ``api.plain``'s.
    """

    def content_type_probe(recording: Mapping[str, Transcript]) -> ProbeResult:
        return content_type(recording, api.stream)

    def event_order(recording: Mapping[str, Transcript]) -> ProbeResult:
        return each_stream(recording, api.streams, api.order)

    def matches_plain(recording: Mapping[str, Transcript]) -> ProbeResult:
        missing = unavailable(recording, api.stream) or unavailable(
            recording, api.plain
        )
        if missing:
            return missing
        want = api.plain_answer(json_body(recording[api.plain]))
        if want is None:
            return fail(f"non-streamed body {clip(recording[api.plain].body)}")
        got = api.answer(recording[api.stream])
        if got != want:
            return fail(f"{_shown(got)} != {_shown(want)}")
        return passed(clip(got[0]))

    rule = f"A {api.title} stream is answered with ``Content-Type: "
    rule += "text/event-stream``."
    return (
        _named(f"{api.name}_content_type", rule, api.content_type_spec,
               content_type_probe),
        _named(f"{api.name}_event_order", api.order_rule, api.order_spec,
               event_order),
        _named(f"{api.name}_matches_plain", api.plain_rule, api.plain_spec,
               matches_plain),
    )  # fmt: skip
