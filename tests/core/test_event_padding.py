"""Padding of the typed event streams (Responses, Messages): ``EventPadder``.

A delta's size depends on its text only through the ladder step of the text's
JSON, whatever the text; other events are a power of two; a heartbeat looks
like the last delta; without its ``obfuscation`` field every event is the
unpadded stream's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Finish,
    FinishReason,
    Heartbeat,
    StreamEvent,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.contracts import stream_machine
from sluicegate.core.wire.padding import FILL_ALPHABET, PAD_FIELD, Filler
from sluicegate.core.wire.sse import SSEDecoder

ENDPOINTS = [Endpoint.RESPONSES, Endpoint.MESSAGES]
DELTAS = {"response.output_text.delta", "content_block_delta"}
# Texts whose JSON is at most 16 bytes: one ladder step.
SHORT = st.text(min_size=1, max_size=16).filter(lambda t: len(json.dumps(t)) <= 18)


def _header(endpoint: Endpoint) -> ResponseHeader:
    prefix = "resp_" if endpoint is Endpoint.RESPONSES else "msg_"
    return ResponseHeader(prefix + "0" * 32, 1700000000, "default", endpoint, 1)


def _frames(
    endpoint: Endpoint, events: list[StreamEvent], seed: int | None
) -> list[bytes]:
    machine = stream_machine(_header(endpoint), None if seed is None else Filler(seed))
    frames = machine.start()
    for event in events:
        frames += machine.feed(event)
    return frames


def _decoded(frame: bytes) -> tuple[str | None, Any]:
    if frame.startswith(b":"):
        return None, ":"
    (event,) = SSEDecoder().feed(frame)
    payload = json.loads(event.data)
    pad = payload.pop(PAD_FIELD, "")
    assert set(pad.encode()) <= set(FILL_ALPHABET)
    return event.event, payload


def _kind(frame: bytes) -> str | None:
    return _decoded(frame)[0]


def _events(texts: list[str]) -> list[StreamEvent]:
    events: list[StreamEvent] = [Delta(0, t) for t in texts]
    return [*events, Heartbeat(), Finish(0, FinishReason.STOP), End(Usage(9, 3))]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@given(pairs=st.lists(st.tuples(SHORT, SHORT), min_size=1, max_size=12))
def test_short_deltas_have_one_size_whatever_their_text(
    endpoint: Endpoint, pairs: list[tuple[str, str]]
) -> None:
    one = _frames(endpoint, _events([a for a, _ in pairs]), seed=1)
    other = _frames(endpoint, _events([b for _, b in pairs]), seed=2)
    assert len(one) == len(other)
    for a, b in zip(one, other, strict=True):
        if _kind(a) in DELTAS:
            assert len(a) == len(b)
    deltas = [len(f) for f in one if _kind(f) in DELTAS]
    beat = next(f for f in one if _kind(f) in (None, "ping"))
    assert len(beat) == deltas[-1]  # a heartbeat looks like the last token
    for frame in one:
        if _kind(frame) not in (*DELTAS, None, "ping"):
            assert len(frame) & (len(frame) - 1) == 0  # a power of two


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_without_the_pad_every_event_is_the_unpadded_streams(
    endpoint: Endpoint,
) -> None:
    call = ToolCallFragment(0, id="call_1", name="f", arguments='{"a": 1}')
    events: list[StreamEvent] = [
        Delta(0, "Hello, "),
        Delta(0, "x" * 40),  # several steps up
        Delta(0, "", parts=DeltaParts((call,))),
        Delta(0, "", parts=DeltaParts((ToolCallFragment(0, arguments="}"),))),
        Heartbeat(),
        Finish(0, FinishReason.TOOL_CALLS),
        End(Usage(9, 4)),
    ]
    padded = _frames(endpoint, events, seed=3)
    plain = _frames(endpoint, events, seed=None)
    assert [_decoded(f) for f in padded] == [_decoded(f) for f in plain]
    assert all(PAD_FIELD.encode() in f for f in padded if not f.startswith(b":"))
    assert all(PAD_FIELD.encode() not in f for f in plain)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_heartbeat_before_any_delta_is_padded_on_its_own(endpoint: Endpoint) -> None:
    machine = stream_machine(_header(endpoint), Filler(4))
    machine.start()
    (beat,) = machine.feed(Heartbeat())
    if endpoint is Endpoint.MESSAGES:
        assert len(beat) == 64  # a ping, padded to a power of two of its own
        assert PAD_FIELD.encode() in beat
    else:
        assert len(beat) == 256  # a comment of the default size
        assert beat.startswith(b": keep-alive ")
