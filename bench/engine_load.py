"""The load client of bench/engine.py: streamed completions, timed per token.

The client shares the 2 cores with the servers it measures, and every microsecond
it spends per event is one their llama.cpp threads lose: while streaming it only
splits the bytes into SSE events (raw asyncio, no HTTP parser) and notes the time
of each event that carries text; the response is parsed (h11, then SSE) after it
ended, outside the timed work of the server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h11

from sluicegate.core.wire.sse import SSEDecoder

__all__ = ["Stream", "percentile", "run_streams", "stream_once", "summary"]

# A completions chunk with non-empty text (both servers write compact JSON).
_TEXT = re.compile(rb'"text": ?"(?!")')


@dataclass(frozen=True, slots=True)
class Stream:
    """One streamed completion as the client saw it.

    Attributes:
        tokens: completion tokens (the usage chunk's count, else text events).
        ttft_s: seconds from sending the request to its first text.
        token_times_s: seconds from sending to each text event, in order.
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens`` (0 if absent).
        done: the stream ended with ``[DONE]``.
        status: the HTTP status (a stream that was refused has no tokens).
    """

    tokens: int
    ttft_s: float
    token_times_s: tuple[float, ...]
    cached_tokens: int
    done: bool
    status: int = 200

    @property
    def gaps_s(self) -> list[float]:
        """Seconds between consecutive text events."""
        times = self.token_times_s
        return [b - a for a, b in itertools.pairwise(times)]


async def stream_once(
    port: int,
    prompt: str,
    max_tokens: int,
    *,
    t0: float | None = None,
    stop: asyncio.Event | None = None,
) -> Stream:
    """One streamed ``/v1/completions`` request: greedy, EOS ignored.

    Args:
        t0: the time (``time.perf_counter``) the times are counted from; the
            moment the request is sent when ``None``.
        stop: once set, the stream is closed at its next bytes (the server
            sees a disconnect) and what came so far is returned.

    Raises:
        RuntimeError: the status was not 200.
    """
    body = json.dumps(
        {
            "model": "default",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Accept: text/event-stream\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter() if t0 is None else t0
    times: list[float] = []
    received: list[bytes] = []
    pending = b""
    try:
        writer.write(head + body)
        while data := await reader.read(65536):
            now = time.perf_counter() - start
            received.append(data)
            events = (pending + data).split(b"\n\n")
            pending = events.pop()
            times.extend(now for event in events if _TEXT.search(event))
            if stop is not None and stop.is_set():
                break
    finally:
        writer.close()
    return _parse(b"".join(received), tuple(times))


def _parse(raw: bytes, times: tuple[float, ...]) -> Stream:
    usage: dict[str, Any] | None = None
    done = False
    status, body = _response_body(raw)
    if status != 200:
        return Stream(0, math.nan, (), 0, False, status)
    for event in SSEDecoder().feed(body):
        if event.data == "[DONE]":
            done = True
            continue
        payload = json.loads(event.data)
        if payload.get("usage"):
            usage = payload["usage"]
    tokens = len(times)
    cached = 0
    if usage is not None:
        tokens = int(usage["completion_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
    ttft = times[0] if times else math.nan
    return Stream(tokens, ttft, times, cached, done)


def _response_body(raw: bytes) -> tuple[int, bytes]:
    """The status and body of one raw HTTP/1.1 response (chunked or not),
    parsed by h11; status 0 when no response head came."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x")]))
    conn.receive_data(raw)
    conn.receive_data(b"")  # the server closed the connection
    parts: list[bytes] = []
    status = 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:  # the client closed it mid-body (stop)
            return status, b"".join(parts)
        if isinstance(event, h11.Response):
            status = event.status_code
        if isinstance(event, h11.Data):
            parts.append(bytes(event.data))
        if event is h11.NEED_DATA or isinstance(
            event, h11.EndOfMessage | h11.ConnectionClosed
        ):
            return status, b"".join(parts)


async def run_streams(
    port: int, prompts: Sequence[str], max_tokens: int
) -> tuple[list[Stream], float]:
    """One request per prompt, all at once; the streams and the wall time (s)."""
    start = time.perf_counter()
    streams = await asyncio.gather(
        *(stream_once(port, p, max_tokens, t0=start) for p in prompts)
    )
    return list(streams), time.perf_counter() - start


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(runs: Sequence[tuple[list[Stream], float]]) -> dict[str, float]:
    """tok/s (median over runs), TTFT and gap p50/p99 (ms, over all streams);
    streams unfinished (no [DONE]), refused (not 200) and empty (200, no token)."""
    rates = [sum(s.tokens for s in streams) / wall for streams, wall in runs]
    ttfts = [s.ttft_s for streams, _ in runs for s in streams if s.tokens]
    gaps = [g for streams, _ in runs for s in streams for g in s.gaps_s]
    every = [s for streams, _ in runs for s in streams]
    unfinished = sum(1 for s in every if not s.done and s.status == 200)
    refused = sum(1 for s in every if s.status != 200)
    empty = sum(1 for s in every if s.status == 200 and s.tokens == 0)
    return {
        "tok_s": statistics.median(rates),
        "ttft_p50_ms": 1000 * percentile(ttfts, 50),
        "ttft_p99_ms": 1000 * percentile(ttfts, 99),
        "gap_p50_ms": 1000 * percentile(gaps, 50),
        "gap_p99_ms": 1000 * percentile(gaps, 99),
        "unfinished": unfinished,
        "refused": refused,
        "empty": empty,
    }
