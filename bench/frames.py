"""CPU per token of the per-token paths: a text delta's frame, an upstream's event.

Two micro-measurements, each CPU time (``time.process_time``, so a busy machine
inflates them less than wall time would) per call, the median of ``--repeat``
runs:

- a text delta through each API's stream machine (chat, Responses, Messages;
  padded and not), 500 streams of 200 tokens each, fed one token at a time;
  on chat also with continuous usage (the usage so far on every delta, as a
  gateway asks of its sluicegate upstreams);
- an upstream's padded one-choice content event, without and with continuous
  usage, through ``UpstreamReader``:
  the fast path (the event read from its bytes by a learned template) and the
  full parse (the same reader with no template).

First it counts how many events of a sluicegate upstream's own stream (as a
gateway asks for it: padded, usage on every chunk; 200 tokens) the reader
takes by its template: the fast path's hit rate on that upstream.

Run it against another checkout's code with ``PYTHONPATH=OTHER/src``: the
before/after of a change (it imports the core's modules from before its
subpackages too). Prints one line per figure; not a test.

Run: ``.venv/bin/python bench/frames.py [--repeat 5]``
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from sluicegate.core.events import Delta, Usage


def _module(name: str, before: str) -> Any:
    """The core's module ``name``, or ``before`` in a checkout from before the
    core had subpackages."""
    try:
        return importlib.import_module(f"sluicegate.core.{name}")
    except ImportError:
        return importlib.import_module(f"sluicegate.core.{before}")


_chunks = _module("wire.chunks", "chunks")
Endpoint, ResponseHeader = _chunks.Endpoint, _chunks.ResponseHeader
Filler = _module("wire.padding", "padding").Filler
UpstreamReader = _module("upstream.reader", "upstream").UpstreamReader
stream_machine = _module("wire.contracts", "wire").stream_machine

EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
    b'"model":"scripted","system_fingerprint":"fp_1","choices":[{"index":0,'
    b'"delta":{"content":"%s"},"logprobs":null,"finish_reason":null}],'
    b'"usage":null,"obfuscation":"%s"}\n\n'
)
# The same with continuous usage, which the gateway asks of vLLM and sluicegate.
USAGE_EVENT = EVENT.replace(
    b'"usage":null',
    b'"usage":{"prompt_tokens":11,"completion_tokens":%d,"total_tokens":%d}',
)


def _delta_us(endpoint: Any, padded: bool, usage: bool = False) -> float:
    prefix = "resp_" if endpoint is Endpoint.RESPONSES else "id_"
    header = ResponseHeader(prefix + "0" * 32, 1700000000, "scripted", endpoint)
    if usage:
        header = ResponseHeader(
            header.id, header.created, header.model, endpoint, include_usage=True,
            continuous_usage=True, prompt_tokens=11,
        )  # fmt: skip
    machines = []
    for seed in range(500):
        machine = stream_machine(header, Filler(seed) if padded else None)
        machine.start()
        machine.feed(Delta(0, "Hi"))
        machines.append(machine)
    tokens = [
        Delta(0, " token", usage=Usage(11, n) if usage else None) for n in range(2, 202)
    ]
    start = time.process_time()
    for machine in machines:
        feed = machine.feed
        for token in tokens:
            feed(token)
    return (time.process_time() - start) / (500 * 200) * 1e6


def _reader_us(fast: bool, usage: bool, calls: int = 100_000) -> float:
    reader = UpstreamReader(Endpoint.CHAT)
    for n in (1, 2):  # the first event goes through the decoder, the next learns
        args = (b"Hi", n, 11 + n, b"abc") if usage else (b"Hi", b"abc")
        reader.feed((USAGE_EVENT if usage else EVENT) % args)
    if not fast and hasattr(reader, "_template"):
        reader._template = None
        reader._learns = 1 << 30  # learns nothing more
    if usage:
        events = [USAGE_EVENT % (b" token", n, 11 + n, b"xyz-_0") for n in range(calls)]
    else:
        events = [EVENT % (b" token", b"xyz-_0")] * calls
    start = time.process_time()
    for event in events:
        reader.feed(event)
    return (time.process_time() - start) / calls * 1e6


def _template_hits(tokens: int = 200) -> tuple[int, int]:
    """``(read by the template, events)`` of the reader on a sluicegate
    upstream's own stream as a gateway asks for it (padded, usage on every
    chunk): a role chunk, ``tokens`` content chunks, the finish, the usage
    chunk and ``[DONE]``."""
    events = _module("events", "events")
    header = ResponseHeader(
        "chatcmpl-1", 1, "scripted", Endpoint.CHAT, include_usage=True,
        system_fingerprint="fp_1", continuous_usage=True, prompt_tokens=11,
    )  # fmt: skip
    machine = stream_machine(header, Filler(7))
    frames = list(machine.start())
    words = ("The", "quick", "brown", "fox", "streams", "tokens", "once", "upon")
    for n in range(1, tokens + 1):
        usage = events.Usage(11, n)
        frames += machine.feed(Delta(0, " " + words[n % len(words)], None, usage))
    frames += machine.feed(events.Finish(0, events.FinishReason.LENGTH, usage))
    frames += machine.feed(events.End(usage))
    template = _module("upstream.fast", "upstream_fast").DeltaTemplate
    read, hits = template.read, [0]

    def counted(self: Any, line: bytes) -> Any:
        got = read(self, line)
        hits[0] += got is not None
        return got

    template.read = counted
    try:
        reader = UpstreamReader(Endpoint.CHAT)
        for frame in frames:
            reader.feed(frame)
    finally:
        template.read = read
    return hits[0], reader.events


def main() -> None:
    """Print each figure (us of CPU per call), the median of the runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, Callable[[], float]] = {}
    for endpoint in (Endpoint.CHAT, Endpoint.RESPONSES, Endpoint.MESSAGES):
        for padded in (False, True):
            name = f"delta {endpoint.name.lower()}{' padded' if padded else ''}"
            figures[name] = functools.partial(_delta_us, endpoint, padded)
    for padded in (False, True):
        name = f"delta chat, continuous usage{' padded' if padded else ''}"
        figures[name] = functools.partial(_delta_us, Endpoint.CHAT, padded, True)
    for usage in (False, True):
        kind = "upstream event" + (", continuous usage" if usage else "")
        figures[f"{kind}, fast path"] = functools.partial(_reader_us, True, usage)
        figures[f"{kind}, full parse"] = functools.partial(_reader_us, False, usage)
    hits, events = _template_hits()
    print(f"upstream reader on sluicegate's own stream: {hits} of {events} events")
    print("  read by the template (the rest parsed whole)")
    for name, measure in figures.items():
        runs = [measure() for _ in range(args.repeat)]
        print(f"{name}: {statistics.median(runs):.2f} us (from {min(runs):.2f})")


if __name__ == "__main__":
    main()
