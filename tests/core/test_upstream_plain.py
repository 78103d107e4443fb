"""UpstreamReader's plain-event fast path against its slow twin, the SSE decoder.

A reader fed one byte at a time never completes an event inside the fast path,
so everything it returns went through ``SSEDecoder`` and ``_read``; a reader fed
whole events after the first one reads plain events itself. Both must give the
same items for every body (invalid UTF-8 apart: see the last test).
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.upstream.items import (
    PROTOCOL_ERROR_CODE,
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamItem,
)
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.wire.chunks import Endpoint

CHAT = Endpoint.CHAT
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"choices": [choice], "usage": None}) + b"\n\n"


def slow(body: bytes) -> tuple[list[UpstreamItem], int]:
    reader = UpstreamReader(CHAT)
    items: list[UpstreamItem] = []
    for i in range(len(body)):
        items += reader.feed(body[i : i + 1])
    return items + reader.flush(), reader.events


def fast(parts: list[bytes]) -> tuple[list[UpstreamItem], int]:
    reader = UpstreamReader(CHAT)
    items = reader.feed(ROLE)
    for part in parts:
        items += reader.feed(part)
    return items + reader.flush(), reader.events


def test_plain_events_give_what_the_decoder_gives() -> None:
    parts = [chunk("Hel"), chunk("lo") + chunk(" there"), chunk(None, "stop"), DONE]
    items, events = fast(parts)
    assert items == [
        UpstreamDelta(0, "Hel"),
        UpstreamDelta(0, "lo"),
        UpstreamDelta(0, " there"),
        *items[3:],
    ]
    assert items[-1] == UpstreamDone()
    assert (items, events) == slow(ROLE + b"".join(parts))


OTHERS = [
    b": keep-alive\n\n",  # a comment
    b"event: error\ndata: {}\n\n",  # another field first
    chunk("cr").replace(b"\n", b"\r\n"),  # CR line ends
    b'data: {"choices":\ndata: []}\n\n',  # two data lines
    b'data:{"choices":[]}\n\n',  # no space after the colon
    b'data:  {"choices":[]}\n\n',  # two spaces
    b"data: [1, 2]\n\n",  # JSON, but no object
    b"data: {not json}\n\n",
    b"data: [DONE] \n\n",  # [DONE] with a blank after it
    b'data: {"error": {"message": "oom"}}\n\n',
    b'data: {"object": "error", "message": "bad", "code": 400}\n\n',
    b'data: {"choices": []}\n',  # the event's blank line in the next part
    b"\n",
    b'data: {"choices": []}',  # cut inside the line
]


@pytest.mark.parametrize("other", OTHERS)
def test_what_the_fast_path_leaves_goes_to_the_decoder(other: bytes) -> None:
    parts = [chunk("a") + other + chunk("b"), chunk("c") + chunk(None, "stop"), DONE]
    assert fast(parts) == slow(ROLE + b"".join(parts))
    assert fast([b"".join(parts)]) == slow(ROLE + b"".join(parts))


def test_nothing_after_done_is_read() -> None:
    items, events = fast([chunk("a", "stop") + DONE + chunk("never") + b"junk"])
    assert items[-1] == UpstreamDone()
    assert (items, events) == slow(ROLE + chunk("a", "stop") + DONE + chunk("never"))
    assert events == 3


def test_an_error_event_ends_the_fast_path_too() -> None:
    parts = [chunk("a") + b'data: {"error": "boom"}\n\n' + chunk("never")]
    items, _ = fast(parts)
    assert items[-1] == UpstreamError("boom")
    assert fast(parts) == slow(ROLE + parts[0])


blocks = st.sampled_from(
    [chunk("x"), chunk("\u00e9\u6f22"), chunk(None), chunk("", "stop"), DONE, *OTHERS]
)


@given(st.lists(blocks, max_size=8), st.lists(st.integers(0, 400), max_size=4))
def test_any_body_and_split_gives_what_the_decoder_gives(
    pieces: list[bytes], cuts: list[int]
) -> None:
    body = b"".join(pieces)
    marks = sorted({min(c, len(body)) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *marks], [*marks, len(body)], strict=True)]
    assert fast(parts) == slow(ROLE + body)


def test_invalid_utf8_after_plain_events_keeps_them() -> None:
    # The decoder alone loses the events of the chunk it fails in; the fast
    # path has read the ones before the bad bytes, as one-byte feeds do.
    bad = b'data: {"choices": "\xff"}\n\n'
    items, _ = fast([chunk("a") + bad + chunk("never")])
    expected, _ = slow(ROLE + chunk("a") + bad)
    for got in (items, expected):
        assert got[0] == UpstreamDelta(0, "a")
        assert len(got) == 2
        assert isinstance(got[1], UpstreamError)
        assert got[1].code == PROTOCOL_ERROR_CODE
