"""The load process of ``bench/streams.py`` and ``bench/gateway.py``.

``bench/streams.py --load`` runs ``main`` here: N streaming chat requests over
raw asyncio sockets, their starts spread uniformly over ``--ramp-s`` seconds,
each asking for ``rate x duration`` tokens, and prints what it measured as one
JSON object.

It shares the machine with the server it measures, so every CPU second it
spends is one the server did not get: a read costs only a time stamp, the count
of content events in it and two references kept. Each stream keeps its reads'
stamps and counts in two arrays; the gaps, lags, time to first token and the
stream's end are worked out from them once every stream is over (``tally``),
when the server is idle. ``load_cpu_share`` and ``load_cpu_us_per_token``
cover the streams' time only, not that tally.

What a read counts, and why it is exact for these servers:

- a content event is one ``"content":"`` that is not ``"content":""`` (the
  baseline's role chunk): one per token, since the script is ASCII and every
  server writes whole events (no UTF-8 held back, no event split by a write);
- a read's events arrived at its stamp; events that arrive in one read count
  as gaps of zero (``-1/rate`` added);
- the response's end is the chunked body's last chunk (``0``) at the end of a
  read, which closes the connection; the last two reads are kept and tell a
  finished stream (``[DONE]`` and the usage's ``completion_tokens``) from an
  errored one (an in-band error event) or a truncated one (closed without
  either);
- a response that is not ``200`` is closed at its first read (rejected).

With ``--client native`` the streams are run by ``bench/stream_client.c``
instead, which only keeps each read and its time (stamped up to a quantum
late: it wakes at most once a quantum); ``bench/stream_native.py``
feeds them to ``Stream.take`` afterwards, so what is counted is the same.

Two reads that split a content marker would lose one count; ``tally`` compares
each finished stream's count with its usage and reports the streams that
differ (``miscounted``), which is 0 in every run so far.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import random
import re
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

__all__ = ["LoadStats", "Stream", "main", "percentiles", "request_bytes", "tally"]

CONTENT = b'"content":"'
EMPTY_CONTENT = b'"content":""'
DONE = b"data: [DONE]"
ERROR = b'data: {"error"'
OK = b"HTTP/1.1 200"
END = b"0\r\n\r\n"
"""The chunked body's last chunk (no SSE chunk ends so: their data ends in a
blank line, then CRLF), alone in a read or after the last event's chunk."""
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')

perf_counter = time.perf_counter


class Stream(asyncio.Protocol):
    """One streaming request: stamps each read and counts its content events."""

    __slots__ = (
        "before",
        "counts",
        "done",
        "head",
        "last",
        "received",
        "request",
        "sent_at",
        "stamps",
        "timed_out",
        "transport",
    )

    def __init__(
        self, request: bytes, done: asyncio.Future[None] | None = None
    ) -> None:
        self.request = request
        self.done = done
        self.stamps = array.array("d")
        self.counts = array.array("i")
        self.sent_at = 0.0
        self.received = 0
        self.head: bytes | None = None
        self.before = b""
        self.last = b""
        self.timed_out = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.sent_at = perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.take(perf_counter(), data):
            self.transport.close()

    def take(self, now: float, data: bytes) -> bool:
        """Keep one read that arrived at ``now`` (perf_counter seconds): its
        stamp and content events, and it as the last read; whether it ends the
        stream (a refusal's first read, or one ending in the body's last
        chunk). The native client's reads come here too, after the streams."""
        self.stamps.append(now)
        self.counts.append(data.count(CONTENT) - data.count(EMPTY_CONTENT))
        self.received += len(data)
        self.before = self.last
        self.last = data
        if self.head is None:
            self.head = data
            if not data.startswith(OK):
                return True
        return data.endswith(END)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


@dataclass
class LoadStats:
    """What the load measured over all its streams (``tally``'s result)."""

    rate: float
    window: tuple[float, float]
    gaps_ms: array.array[float] = field(default_factory=lambda: array.array("d"))
    lags_ms: array.array[float] = field(default_factory=lambda: array.array("d"))
    ttft_ms: list[float] = field(default_factory=list)
    ttfb_ms: list[float] = field(default_factory=list)
    in_window: int = 0
    events: int = 0
    completion_tokens: int = 0
    finished: int = 0
    truncated: int = 0
    timed_out: int = 0
    errored: int = 0
    rejected: int = 0
    miscounted: int = 0
    bytes_received: int = 0


def tally(streams: Sequence[Stream | None], stats: LoadStats) -> LoadStats:
    """Add each stream's reads to ``stats``: its gaps, lags, TTFT and TTFB (ms),
    the content events in ``stats.window`` (perf_counter seconds) and its end.

    ``None`` is a stream whose connection failed (rejected).
    """
    step_ms = 1000.0 / stats.rate
    start, end = stats.window
    for stream in streams:
        if stream is None:
            stats.rejected += 1
            continue
        stats.bytes_received += stream.received
        if stream.stamps:
            stats.ttfb_ms.append((stream.stamps[0] - stream.sent_at) * 1000.0)
        count = 0
        first = last = 0.0
        for now, events in zip(stream.stamps, stream.counts, strict=True):
            if events <= 0:
                continue
            if count == 0:
                first = now
                stats.ttft_ms.append((now - stream.sent_at) * 1000.0)
            else:
                stats.gaps_ms.append((now - last) * 1000.0 - step_ms)
            since_ms = (now - first) * 1000.0
            stats.lags_ms.extend(
                since_ms - k * step_ms for k in range(count, count + events)
            )
            stats.gaps_ms.extend([-step_ms] * (events - 1))  # arrived together
            count += events
            last = now
            if start <= now < end:
                stats.in_window += events
        stats.events += count
        _end(stream, count, stats)
    return stats


def _end(stream: Stream, count: int, stats: LoadStats) -> None:
    """Count how ``stream`` ended (its last two reads say), once."""
    tail = stream.before + stream.last
    if stream.head is not None and not stream.head.startswith(OK):
        stats.rejected += 1
    elif stream.timed_out:
        stats.timed_out += 1
    elif ERROR in tail:
        stats.errored += 1
    elif DONE in tail:
        found = COMPLETION_TOKENS.search(tail)
        usage = int(found[1]) if found else count
        stats.completion_tokens += usage
        stats.miscounted += usage != count
        stats.finished += 1
    else:
        stats.truncated += 1


def request_bytes(port: int, tokens: int, headers: Sequence[str] = ()) -> bytes:
    """One streamed chat request for ``tokens`` tokens, head and body."""
    body = json.dumps(
        {
            "model": "scripted",
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "stream": True,
            "max_tokens": tokens,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + "".join(f"{header}\r\n" for header in headers)
        + "Accept: text/event-stream\r\n\r\n"
    )
    return head.encode() + body


async def _one(
    port: int, request: bytes, delay_s: float, deadline: float
) -> Stream | None:
    await asyncio.sleep(delay_s)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    try:
        transport, stream = await loop.create_connection(
            lambda: Stream(request, done), "127.0.0.1", port
        )
    except OSError:
        return None
    transport.get_extra_info("socket").setsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done, max(deadline - perf_counter(), 0.0))
    if not done.done():  # not over by the deadline: the client gives up
        stream.timed_out = True
        transport.abort()
    return stream


async def _load(
    port: int, request: bytes, delays_s: Sequence[float], deadline_s: float
) -> tuple[float, list[Stream | None]]:
    start = perf_counter()
    deadline = start + deadline_s
    streams = await asyncio.gather(
        *(_one(port, request, delay_s, deadline) for delay_s in delays_s)
    )
    return start, streams


def _run(
    args: argparse.Namespace, request: bytes, delays_s: Sequence[float]
) -> tuple[float, float, float, list[Stream | None]]:
    """(start, CPU seconds, wall seconds, streams) of the load's client."""
    deadline_s = args.ramp_s + 2 * args.duration_s + 10.0
    if getattr(args, "client", "python") == "native":
        import stream_native  # bench/stream_native.py; bench/ is on the path

        tokens = max(int(args.rate * args.duration_s), 1)
        quantum_s = getattr(args, "quantum_ms", stream_native.QUANTUM_S * 1e3) / 1e3
        ran = stream_native.run(
            args.port, request, delays_s, deadline_s, tokens, quantum_s
        )
        return ran.start, ran.cpu_s, ran.wall_s, ran.streams
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    cpu0 = time.process_time()
    wall0 = perf_counter()
    start, streams = asyncio.run(_load(args.port, request, delays_s, deadline_s))
    return start, time.process_time() - cpu0, perf_counter() - wall0, streams


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of ``values`` (``None`` for none)."""
    if len(values) < 2:
        only = values[0] if values else None
        return {"p50": only, "p99": only, "max": only}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p99": cuts[98], "max": max(values)}


def main(args: argparse.Namespace) -> int:
    """Run one load (``--port``, ``--streams``, ``--rate``, ``--duration-s``,
    ``--ramp-s``, ``--header``, ``--client``) and print its measurements as
    JSON."""
    tokens = max(int(args.rate * args.duration_s), 1)
    request = request_bytes(args.port, tokens, args.header)
    rng = random.Random(args.streams)
    delays_s = [rng.uniform(0, args.ramp_s) for _ in range(args.streams)]
    start, cpu_s, wall_s, streams = _run(args, request, delays_s)
    window = (start + args.ramp_s + 0.5, start + args.duration_s)
    stats = tally(streams, LoadStats(args.rate, window))
    window_s = window[1] - window[0]
    report = {
        "tokens_per_s": stats.in_window / window_s if window_s > 0 else 0.0,
        "events": stats.events,
        "completion_tokens": stats.completion_tokens,
        "itl_added_ms": percentiles(stats.gaps_ms),
        "schedule_lag_ms": percentiles(stats.lags_ms),
        "ttft_ms": percentiles(stats.ttft_ms),
        "ttfb_ms": percentiles(stats.ttfb_ms),
        "finished": stats.finished,
        "truncated": stats.truncated,
        "timed_out": stats.timed_out,
        "errored": stats.errored,
        "rejected": stats.rejected,
        "bytes_per_token": stats.bytes_received / max(stats.events, 1),
        "load_cpu_share": cpu_s / wall_s,
    }
    if args.load_detail:  # bench/streams.py's rows only (bench/gateway.py's keys stay)
        report["load_cpu_us_per_token"] = cpu_s / max(stats.events, 1) * 1e6
        report["miscounted"] = stats.miscounted
        report["load_client"] = getattr(args, "client", "python")
        # When the server answered each stream (its first byte), in seconds
        # after the load's start: against the ramp, how fast it took new ones.
        report["answered_s"] = percentiles(
            [s.stamps[0] - start for s in streams if s is not None and s.stamps]
        )
    print(json.dumps(report))
    return 0
