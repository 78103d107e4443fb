"""The Responses and Messages reasoning probes on what sluicegate itself streams
(a scripted thinking model), and on those streams broken one rule at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sluicegate.check import reasoning_events as re_
from sluicegate.check.event_streams import events_of
from sluicegate.check.probes import MESSAGES_PROBES, RESPONSES_PROBES
from sluicegate.check.responses_probes import responses_matches_plain
from sluicegate.check.transcript import Transcript
from sluicegate.check.verdicts import Verdict
from tests.server.test_reasoning import scripted_app

from .test_api_probes import sse

pytestmark = pytest.mark.anyio

TOKENS = [b"<th", b"ink>pl", b"an: 2+2=4</", b"think>The", b" answer is 4."]
RESPONSES = {
    "model": "scripted",
    "input": "2+2?",
    "reasoning": {"effort": "low"},
    "stream": True,
}
MESSAGES = {
    "model": "scripted",
    "max_tokens": 2048,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [{"role": "user", "content": "2+2?"}],
    "stream": True,
}
Events = list[dict[str, Any]]


async def _record(tokens: list[bytes], parser: str = "qwen3") -> dict[str, Transcript]:
    """The ``responses_reasoning`` and ``messages_thinking`` exchanges, and a
    Responses request streamed and not (``responses_stream``, ``_plain``)."""
    app = scripted_app(tokens, reasoning_parser=parser)
    transport = httpx.ASGITransport(app=app)
    out = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://t/v1/") as http:
        for name, path, body in (
            ("responses_reasoning", "responses", RESPONSES),
            ("messages_thinking", "messages", MESSAGES),
            ("responses_stream", "responses", RESPONSES),
            ("responses_plain", "responses", {**RESPONSES, "stream": False}),
        ):
            answer = await http.post(path, json=body)
            out[name] = Transcript(
                request=body,
                path=path,
                status=answer.status_code,
                headers=dict(answer.headers),
                body=answer.content,
            )
    return out


def _edited(t: Transcript, edit: Callable[[Events], Events]) -> Transcript:
    events, problem = events_of(t)
    assert problem is None
    objects = edit([dict(obj) for _, obj in events])
    return Transcript(
        request=t.request, path=t.path, headers=t.headers, body=sse(objects)
    )


async def test_sluicegates_own_reasoning_streams_pass() -> None:
    recording = await _record(TOKENS)
    assert re_.responses_reasoning_framing(recording).verdict is Verdict.PASS
    assert re_.messages_reasoning_framing(recording).verdict is Verdict.PASS
    assert re_.responses_reasoning_framing in RESPONSES_PROBES
    assert re_.messages_reasoning_framing in MESSAGES_PROBES
    # The non-streamed answer's text is its message's, not its reasoning's too.
    assert responses_matches_plain(recording).verdict is Verdict.PASS


async def test_streams_without_reasoning_are_not_observable() -> None:
    recording = await _record(TOKENS, parser="none")  # a model without reasoning
    assert re_.responses_reasoning_framing(recording).verdict is Verdict.NOT_OBSERVABLE
    assert re_.messages_reasoning_framing(recording).verdict is Verdict.NOT_OBSERVABLE


def _first(events: Events, kind: str) -> int:
    return next(i for i, e in enumerate(events) if e["type"] == kind)


def _after_answer(events: Events) -> Events:
    thought = events[_first(events, "response.reasoning_text.delta")]
    events.insert(_first(events, "response.output_text.delta") + 1, dict(thought))
    return events


def _marked(kind: str, field: str) -> Callable[[Events], Events]:
    def edit(events: Events) -> Events:
        event = events[_first(events, kind)]
        delta = event["delta"]
        if isinstance(delta, dict):
            event["delta"] = {**delta, field: "</think>" + delta[field]}
        else:
            event[field] = "</think>" + delta
        return events

    return edit


def _text_marked(events: Events) -> Events:
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            e["delta"] = {**e["delta"], "text": "</think>" + e["delta"]["text"]}
            break
    return events


def _done_differs(events: Events) -> Events:
    events[_first(events, "response.reasoning_text.done")]["text"] = "other"
    return events


def _uncounted(events: Events) -> Events:
    response = events[-1]["response"]
    response["usage"] = {**response["usage"], "output_tokens_details": {
        "reasoning_tokens": 0}}  # fmt: skip
    return events


def _unsigned(events: Events) -> Events:
    return [
        e
        for e in events
        if not (
            e["type"] == "content_block_delta"
            and e["delta"]["type"] == "signature_delta"
        )
    ]


def _thinking_in_text(events: Events) -> Events:
    text_index = events[_first(events, "content_block_delta")]["index"] + 1
    last = max(
        i
        for i, e in enumerate(events)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )
    thought = dict(events[_first(events, "content_block_delta")])
    events.insert(last + 1, {**thought, "index": text_index})
    return events


def _answer_quotes_markers(kind: str, field: str) -> Callable[[Events], Events]:
    """The first answer delta opens with ``<think>`` and quotes ``</think>``:
    the model's own text, as a second block or a quote."""

    def edit(events: Events) -> Events:
        for event in events:
            delta = event.get("delta")
            if event["type"] != kind:
                continue
            if isinstance(delta, dict) and delta.get("type") == field:
                event["delta"] = {**delta, "text": f"<think>{delta['text']} </think>"}
                break
            if isinstance(delta, str):
                event["delta"] = f"<think>{delta} </think>"
                break
        return events

    return edit


def _thought_closed(events: Events) -> Events:
    """The last thinking delta keeps the end marker the split should drop."""
    last = max(
        i
        for i, e in enumerate(events)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta"
    )
    delta = events[last]["delta"]
    events[last]["delta"] = {**delta, "thinking": delta["thinking"] + "</think>"}
    return events


@pytest.mark.parametrize(
    ("name", "edit", "evidence"),
    [
        ("responses_reasoning", _after_answer, "after the answer"),
        (
            "responses_reasoning",
            _marked("response.output_text.delta", "delta"),
            "the answer begins with </think>",
        ),
        ("responses_reasoning", _done_differs, "!= deltas"),
        ("responses_reasoning", _uncounted, "reasoning_tokens 0"),
        ("messages_thinking", _unsigned, "signature_delta events"),
        ("messages_thinking", _thinking_in_text, "in a 'text' block"),
        ("messages_thinking", _text_marked, "the answer begins with </think>"),
        ("messages_thinking", _marked("content_block_delta", "thinking"), None),
        ("messages_thinking", _thought_closed, "the reasoning ends with </think>"),
        (
            "messages_thinking",
            _answer_quotes_markers("content_block_delta", "text_delta"),
            None,
        ),
        (
            "responses_reasoning",
            _answer_quotes_markers("response.output_text.delta", ""),
            None,
        ),
    ],
)
async def test_a_stream_that_breaks_a_rule_fails(
    name: str, edit: Callable[[Events], Events], evidence: str | None
) -> None:
    recording = await _record(TOKENS)
    recording[name] = _edited(recording[name], edit)
    probe = (
        re_.responses_reasoning_framing
        if name.startswith("responses")
        else re_.messages_reasoning_framing
    )
    result = probe(recording)
    if evidence is None:  # a marker away from the boundary is the model's text
        assert result.verdict is Verdict.PASS, result
        return
    assert result.verdict is Verdict.FAIL, result
    assert evidence in result.evidence
