"""``sluicegate demo``: the toy byte-piece example, run through the real core.

Twelve generated token ids from a toy vocabulary in which "é" and "€" are split
across tokens, with the stop string ``###END``. The demo prints the naive
per-token decode (broken characters, leaked stop string), then what the core
emits and holds back at each token, then the SSE frames of the chat response.
"""

from __future__ import annotations

import time
from typing import TextIO

from sluicegate.core.decoding.choice import ChoiceDecoder
from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.stream import StreamMachine

__all__ = ["GENERATED", "PIECES", "PROMPT_TOKENS", "STOP", "run_demo"]

PIECES: tuple[bytes, ...] = (
    b"",  # 0: padding, so that ids index the tuple
    b"Caf",
    b"\xc3",  # first byte of "é" (C3 A9)
    b"\xa9",
    b" costs",
    b" 5",
    b"\xe2\x82",  # first two bytes of "€" (E2 82 AC)
    b"\xac",
    b".\n",
    b"##",
    b"#",
    b"END",
    b" more",
)
"""The toy vocabulary: token id -> piece bytes."""

GENERATED: tuple[int, ...] = tuple(range(1, 13))
"""What the toy model generates: token ids 1 to 12."""

STOP = "###END"
"""The request's stop string."""

PROMPT_TOKENS = 9
"""Prompt length reported in the usage chunk (tokens)."""


def run_demo(out: TextIO, *, created: int | None = None) -> None:
    """Print the demo to ``out``.

    Args:
        out: where to write (text).
        created: the chunks' ``created`` (Unix seconds); now when ``None``.
    """
    naive = "".join(PIECES[t].decode("utf-8", errors="replace") for t in GENERATED)
    print(f"naive per-token decode: {naive!r}", file=out)
    print(file=out)

    stops = StopMatcher([STOP])
    choice = ChoiceDecoder(IncrementalDetokenizer(PIECES), stops)
    header = ResponseHeader(
        id="chatcmpl-demo",
        created=int(time.time()) if created is None else created,
        model="toy",
        endpoint=Endpoint.CHAT,
        include_usage=True,
    )
    machine = StreamMachine(header)
    frames = machine.start()
    content_events = 0
    for token_id in GENERATED:
        step = choice.feed([token_id])
        delta_frames = machine.feed(Delta(0, step.text))
        content_events += len(delta_frames)
        frames += delta_frames
        stopped = f"  stop {choice.stop!r}" if choice.finished else ""
        print(
            f"token {token_id:>2}  {PIECES[token_id]!r:<14} "
            f"emit {step.text!r:<10} held {stops.held!r:<7}{stopped}".rstrip(),
            file=out,
        )
        if choice.finished:
            break
    tail = choice.flush()
    frames += machine.feed(Delta(0, tail.text))
    frames += machine.feed(Finish(0, FinishReason.STOP))
    frames += machine.feed(End(Usage(PROMPT_TOKENS, choice.completion_tokens)))
    print(file=out)
    print(
        f"{choice.completion_tokens} tokens consumed, {content_events} content "
        f"events, stopped={choice.finished}",
        file=out,
    )
    print(file=out)
    out.write(b"".join(frames).decode())
