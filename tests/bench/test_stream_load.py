"""The load process of ``bench/streams.py``: what it makes of a stream's reads.

Each read is handed to ``Stream.data_received`` at a time the test sets (the
module's clock replaced), then ``tally`` works out the gaps, TTFT, window and
end; a fake transport records the closes. The native client's log, replayed
after the streams (``bench/stream_native.py``), must give the same; and the
native client itself runs against a socket server here that answers each
connection with set writes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import threading
from types import ModuleType
from typing import Any

import pytest

from tests.integration.servers import load_bench

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
    module: ModuleType = load_bench("stream_load", monkeypatch, "stream_load")
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


# ------------------------------------------------- the native client and its log


@pytest.fixture
def native(load: ModuleType, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``bench/stream_native.py``, importing the ``load`` fixture's module."""
    module: ModuleType = load_bench("stream_native", monkeypatch, "stream_native")
    return module


def _log(streams: list[tuple[float, int, list[tuple[float, bytes]]]]) -> bytes:
    """The client's output for streams of (sent at, state, reads), in the
    format ``bench/stream_client.c`` writes (start 0, 1 CPU s over 2 s)."""
    out = struct.pack("=4sIddd", b"SGC1", len(streams), 0.0, 1.0, 2.0)
    out += b"".join(struct.pack("=dii", sent, state, 0) for sent, state, _ in streams)
    reads = sorted(
        (t, index, data)
        for index, (_, _, stream_reads) in enumerate(streams)
        for t, data in stream_reads
    )
    log = b"".join(struct.pack("=iid", i, len(d), t) + d for t, i, d in reads)
    return out + struct.pack("=Q", len(log)) + log


def test_the_native_log_replays_to_what_the_python_client_counts(
    load: ModuleType, native: ModuleType
) -> None:
    finished = [
        (0.010, HEAD + ROLE),
        (0.060, _token("a")),
        (0.125, _token("b") + _token("c")),
        (0.130, _usage(3) + _chunk("[DONE]")),
        (0.131, b"0\r\n\r\n"),
    ]
    errored = [(0.02, HEAD + _token("a")), (0.09, ERROR + b"0\r\n\r\n")]
    refused = [(0.01, b"HTTP/1.1 503 Service Unavailable\r\n")]
    late = [(0.03, HEAD + _token("a")), (0.07, _token("b"))]
    cases = [finished, errored, refused, late]

    live = [_feed(load, reads)[0] for reads in cases]
    live[3].timed_out = True
    ran = native.replay(
        _log([(0.0, 0, reads) for reads in cases[:3]] + [(0.0, 2, late), (0, 1, [])]),
        b"request",
    )
    window = (0.05, 1.0)
    ours = load.tally(ran.streams, load.LoadStats(RATE, window))
    theirs = load.tally([*live, None], load.LoadStats(RATE, window))

    assert ours == theirs  # counts, gaps, lags, TTFT, window and every end
    assert (ours.finished, ours.errored, ours.rejected, ours.timed_out) == (1, 1, 2, 1)
    assert (ran.start, ran.cpu_s, ran.wall_s) == (0.0, 1.0, 2.0)
    assert ran.streams[4] is None  # its connection failed


def _serve(
    listener: socket.socket, replies: list[list[bytes]], held: list[socket.socket]
) -> None:
    """Answer one connection per reply, in accept order: read the request,
    write the reply, keep the connection open (in ``held``)."""
    for writes in replies:
        conn, _ = listener.accept()
        held.append(conn)
        conn.recv(65536)
        for data in writes:
            conn.sendall(data)


@pytest.mark.timeout(30)
def test_the_native_client_keeps_every_read_and_ends_each_stream_as_it_ended(
    native: ModuleType, load: ModuleType
) -> None:
    if native.compiler() is None:
        pytest.skip("needs a C compiler")
    answers = [
        [HEAD + ROLE, _token("a"), _token("b"), _usage(2) + DONE],  # finished
        [b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"],
        [HEAD + _token("a")],  # never ends: timed out at the deadline
    ]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        held: list[socket.socket] = []
        server = threading.Thread(target=_serve, args=(listener, answers, held))
        server.start()
        try:
            ran = native.run(port, b"GET / HTTP/1.1\r\n\r\n", [0.0, 0.01, 0.02], 0.5, 4)
        finally:
            server.join()
            for conn in held:
                conn.close()
        stats = load.tally(ran.streams, load.LoadStats(RATE, (0.0, 1e9)))

    assert (stats.finished, stats.rejected, stats.timed_out) == (1, 1, 1)
    assert (stats.events, stats.completion_tokens, stats.miscounted) == (3, 2, 0)
    assert stats.bytes_received == sum(map(len, itertools.chain(*answers)))
    for stream in ran.streams:
        assert stream is not None
        assert ran.start <= stream.sent_at <= stream.stamps[0]
        assert list(stream.stamps) == sorted(stream.stamps)
    assert ran.cpu_s >= 0.0 < ran.wall_s


def test_a_connection_the_native_client_could_not_make_is_rejected(
    native: ModuleType, load: ModuleType
) -> None:
    if native.compiler() is None:
        pytest.skip("needs a C compiler")
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    ran = native.run(port, b"GET / HTTP/1.1\r\n\r\n", [0.0], 5.0, 4)
    assert ran.streams == [None]
    assert load.tally(ran.streams, load.LoadStats(RATE, (0, 1))).rejected == 1
