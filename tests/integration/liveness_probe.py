"""Liveness under attack, measured from outside: ordinary streams and ``/health`` polls.

``python -m tests.integration.liveness_probe URL MODEL`` prints ``ready``,
then waits for lines on stdin: ``start`` begins measuring, ``stop`` ends it and
prints one JSON line (``Window``'s fields); end of input exits. While a window
is open, one thread streams chat completions of ``MODEL`` from the server at
``URL`` back to back and records when each event arrives; another asks
``/health`` every ``HEALTH_EVERY_S`` and records how long each answer took.

It is its own process so that its clocks do not share a GIL with the test
that attacks the server (reading 200,000 events in the test's process would
show up as gaps here).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import httpx

HEALTH_EVERY_S = 0.05
MAX_TOKENS = 40
TIMEOUT_S = 30.0


@dataclass
class StreamRecord:
    """One probe stream: its status, whether ``[DONE]`` came, its timings (s)."""

    status: int
    done: bool
    ttft_s: float
    max_gap_s: float
    events: int
    received_at: float


@dataclass
class Window:
    """What one ``start`` .. ``stop`` window saw."""

    streams: list[StreamRecord] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    health_failures: list[str] = field(default_factory=list)
    stream_failures: list[str] = field(default_factory=list)


def one_stream(client: httpx.Client, model: str) -> StreamRecord:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "probe"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    received_at = time.time()
    sent = time.monotonic()
    arrivals: list[float] = []
    done = False
    buffer = b""
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for data in response.iter_raw():
            now = time.monotonic()
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            for raw in events:
                if raw.startswith(b"data: "):
                    arrivals.append(now)
                    done = done or raw == b"data: [DONE]"
        status = response.status_code
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return StreamRecord(
        status=status,
        done=done,
        ttft_s=(arrivals[0] - sent) if arrivals else -1.0,
        max_gap_s=max(gaps, default=0.0),
        events=len(arrivals),
        received_at=received_at,
    )


def stream_loop(
    client: httpx.Client, model: str, window: Window, stop: threading.Event
) -> None:
    """Streams back to back until ``stop``; at least one, so that every window
    has a stream that overlapped it."""
    while True:
        try:
            window.streams.append(one_stream(client, model))
        except httpx.HTTPError as exc:
            window.stream_failures.append(repr(exc))
        if stop.is_set():
            return


def health_loop(client: httpx.Client, window: Window, stop: threading.Event) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            answer = client.get("/health")
            if answer.status_code != 200:
                window.health_failures.append(f"{answer.status_code}")
        except httpx.HTTPError as exc:
            window.health_failures.append(repr(exc))
        window.health_s.append(time.monotonic() - started)
        stop.wait(HEALTH_EVERY_S)


def main(url: str, model: str) -> None:
    # The clients are made once, before "ready": making one takes 0.1-0.5 s
    # (its TLS context), longer than a short attack's whole window.
    streams = httpx.Client(base_url=url, timeout=TIMEOUT_S)
    polls = httpx.Client(base_url=url, timeout=TIMEOUT_S)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "start":
            continue
        window, stop = Window(), threading.Event()
        threads = [
            threading.Thread(target=stream_loop, args=(streams, model, window, stop)),
            threading.Thread(target=health_loop, args=(polls, window, stop)),
        ]
        for thread in threads:
            thread.start()
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()
        for thread in threads:
            thread.join()
        print(json.dumps(asdict(window)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
