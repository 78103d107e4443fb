"""The load process of ``bench/streams.py``: what it makes of a stream's reads.

Each read is handed to ``Stream.data_received`` at a time the test sets (the
module's clock replaced), then ``tally`` works out the gaps, TTFT, window and
end; a fake transport records the closes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
RATE = 20.0  # tokens/s: a 50 ms step


def _chunk(payload: dict[str, Any] | str) -> bytes:
    data = (
        payload
        if isinstance(payload, str)
        else json.dumps(payload, separators=(",", ":"))
    )
    event = f"data: {data}\n\n".encode()
    return f"{len(event):x}\r\n".encode() + event + b"\r\n"


ROLE = _chunk({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
DONE = _chunk("[DONE]") + b"0\r\n\r\n"
ERROR = _chunk({"error": {"message": "boom"}})


def _token(text: str) -> bytes:
    return _chunk({"choices": [{"delta": {"content": text}}]})


def _usage(tokens: int) -> bytes:
    return _chunk({"choices": [], "usage": {"completion_tokens": tokens}})


class _Transport:
    def __init__(self) -> None:
        self.closed = 0

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "stream_load", BENCH / "stream_load.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def _feed(load: ModuleType, reads: list[tuple[float, bytes]]) -> tuple[Any, _Transport]:
    """A stream sent at t=0 s that got each ``(t, data)`` read."""
    loop = asyncio.new_event_loop()
    try:
        clock = iter([0.0] + [t for t, _ in reads])
        setattr(load, "perf_counter", lambda: next(clock))  # noqa: B010
        stream = load.Stream(b"request", loop.create_future())
        transport = _Transport()
        stream.connection_made(transport)
        for _, data in reads:
            stream.data_received(data)
        stream.connection_lost(None)
    finally:
        loop.close()
    return stream, transport


def test_gaps_ttft_and_the_window_come_from_the_reads_stamps(load: ModuleType) -> None:
    reads = [
        (0.010, HEAD + ROLE),
        (0.060, _token("a")),
        (0.125, _token("b") + _token("c")),  # two tokens in one read
        (0.130, _usage(3) + _chunk("[DONE]")),
        (0.131, b"0\r\n\r\n"),  # the body's end in a read of its own
    ]
    stream, transport = _feed(load, reads)
    stats = load.tally([stream], load.LoadStats(RATE, (0.100, 1.0)))

    assert transport.closed == 1  # the body's last chunk closes it
    assert stats.ttfb_ms == [pytest.approx(10.0)]
    assert stats.ttft_ms == [pytest.approx(60.0)]
    # 65 ms after "a": 15 ms late; "c" came with "b": -50 ms (a gap of zero)
    assert list(stats.gaps_ms) == [pytest.approx(15.0), pytest.approx(-50.0)]
    # k-th token against first + k/rate: 0, 65 - 50, 65 - 100
    assert list(stats.lags_ms) == [0.0, pytest.approx(15.0), pytest.approx(-35.0)]
    assert (stats.events, stats.in_window) == (3, 2)
    assert (stats.finished, stats.completion_tokens, stats.miscounted) == (1, 3, 0)
    assert stats.bytes_received == sum(len(data) for _, data in reads)


def test_an_in_band_error_a_refusal_and_a_cut_stream_end_as_such(
    load: ModuleType,
) -> None:
    errored, _ = _feed(load, [(0.01, HEAD + _token("a")), (0.06, ERROR + b"0\r\n\r\n")])
    refused, transport = _feed(load, [(0.01, b"HTTP/1.1 503 Service Unavailable\r\n")])
    cut, _ = _feed(load, [(0.01, HEAD + _token("a"))])
    late, _ = _feed(load, [(0.01, HEAD + _token("a"))])
    late.timed_out = True

    stats = load.tally(
        [errored, refused, cut, late, None], load.LoadStats(RATE, (0, 1))
    )

    assert transport.closed == 1  # at the refusal's first read
    assert (stats.errored, stats.rejected, stats.truncated, stats.timed_out) == (
        1,
        2,
        1,
        1,
    )
    assert (stats.finished, stats.events) == (0, 3)


def test_a_content_marker_split_between_reads_is_reported_as_miscounted(
    load: ModuleType,
) -> None:
    token = _token("a")
    cut = token.index(b'"content"') + 4
    reads = [(0.01, HEAD + token[:cut]), (0.02, token[cut:] + _usage(1) + DONE)]
    stream, _ = _feed(load, reads)
    stats = load.tally([stream], load.LoadStats(RATE, (0, 1)))
    assert (stats.finished, stats.events, stats.miscounted) == (1, 0, 1)
