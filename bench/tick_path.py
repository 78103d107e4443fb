"""CPU per token of the path from the engine's clock to a frame, in process.

Two measurements, each CPU time (``time.process_time``) per token over 1,000
streams, the collector off, the median and the smallest of ``--repeat`` runs:

- the engine: a ``ScriptedEngine`` stepping 1,000 sequences at 20 tokens/s on
  a ``ManualClock`` (their starts spread over one step, as a ramp leaves
  them), each listened to by a no-op: the clock, the step, the schedule and
  the push;
- the consumer: each of 1,000 streams' ``SequenceOutputs`` pushed one plain
  token at a time into the server's own pieces, as ``EventStreamResponse``
  wires them (``Generation``, its ``StreamBuffer``, ``EventFrames`` and the
  chat stream machine, padded unless ``--plain``), the sink's write a no-op
  that takes every frame: push to frame, the write itself left out (the
  floor's system call, ``bench/streams.py``'s ``raw``).

Run it against another checkout's code with ``PYTHONPATH=OTHER/src``, pinned
with ``taskset -c 0``, alternating, for a before and after. Prints one line
per figure; not a test.

Run: ``.venv/bin/python bench/tick_path.py [--repeat 9] [--plain]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import statistics
import time
from typing import Any

import uvloop

from sluicegate.core.events import EngineOutput
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.contracts import stream_machine
from sluicegate.core.wire.padding import Filler
from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.prepare.plan import ChoicePlan, Plan
from sluicegate.server.streaming.buffer import StreamBuffer
from sluicegate.server.streaming.generation import Generation
from sluicegate.server.streaming.pump import EventFrames, pump
from sluicegate.server.streaming.sink import FrameSink

STREAMS = 1000
RATE = 20.0
TEXT = " The quick brown fox streams tokens correctly, once upon a time." * 40


def _engine(clock: ManualClock) -> ScriptedEngine:
    return ScriptedEngine(
        TEXT,
        tokens_per_s=RATE,
        max_running=10**6,
        max_queued=10**6,
        context_length=10**6,
        clock=clock,
    )


def engine_us(steps: int = 200) -> float:
    """CPU per token of the engine alone (us)."""
    clock = ManualClock()
    engine = _engine(clock)
    got = [0]

    def listener(item: Any) -> None:
        got[0] += 1

    for i in range(STREAMS):
        params = SamplingParams(max_tokens=steps + 10)
        outputs: Any = engine.generate(GenerateRequest(f"r{i}", (1, 2, 3), params))
        outputs.listen(listener)
        clock.jump(1 / RATE / STREAMS)
        clock.step()
    gc.collect()
    gc.disable()
    try:
        before, start = got[0], time.process_time()
        end = clock.time() + steps / RATE
        while clock.time() < end:
            clock.jump(max(0.0, min(clock.next_due, end) - clock.time()))
            clock.step()
        return (time.process_time() - start) / (got[0] - before) * 1e6
    finally:
        gc.enable()


async def _consumer(padded: bool, steps: int) -> float:
    clock = ManualClock()
    engine = _engine(clock)  # its sequences never step: the clock stays put
    ids = engine.tokenizer.encode(TEXT, add_special=False, parse_special=False)
    tokens = [EngineOutput((i,)) for i in ids]
    written = [0]

    def now(frames: Any) -> bool:
        written[0] += 1
        return True

    async def start(frames: Any) -> None:
        return None

    pumps, outputs = [], []
    for i in range(STREAMS):
        header = ResponseHeader(
            f"chatcmpl-{i}", 1, "scripted", Endpoint.CHAT, 1, True, "fp_1"
        )
        params = SamplingParams(max_tokens=10**6)
        plan = Plan(header, ((1, 2, 3),), (ChoicePlan(0, params),), stream=True)
        generation = Generation(engine, plan, clock)
        generation.start()
        machine = stream_machine(header, Filler(i) if padded else None)
        machine.start()
        machine.wrote()
        buffer = StreamBuffer(1 << 20)
        generation.attach(buffer)
        sink = FrameSink(start, None, on_pending=buffer.poke, now=now)
        source = EventFrames(machine, buffer, sink, clock, eager=True)
        pumps.append(asyncio.ensure_future(pump(source, sink)))
        outputs.append(generation._outputs[0])
    await asyncio.sleep(0)
    gc.collect()
    gc.disable()
    try:
        before, begun = written[0], time.process_time()
        for step in range(steps):
            token = tokens[step % len(tokens)]
            for sequence in outputs:
                sequence.push(token)  # type: ignore[union-attr]
            await asyncio.sleep(0)  # the turn's writes
        took = time.process_time() - begun
    finally:
        gc.enable()
    for task in pumps:
        task.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    return took / (written[0] - before) * 1e6


def consumer_us(padded: bool, steps: int = 150) -> float:
    """CPU per token from the engine's push to the frame's write (us)."""
    return uvloop.run(_consumer(padded, steps))


def main() -> None:
    """Print each figure's median and smallest run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--plain", action="store_true", help="unpadded frames")
    args = parser.parse_args()
    kind = "plain" if args.plain else "padded"
    for name, measure in (
        ("engine", engine_us),
        (f"consumer ({kind})", functools.partial(consumer_us, not args.plain)),
    ):
        runs = [measure() for _ in range(args.repeat)]
        print(
            f"{name}: {statistics.median(runs):.2f} us a token "
            f"(from {min(runs):.2f}; runs {' '.join(f'{r:.2f}' for r in runs)})"
        )


if __name__ == "__main__":
    main()
