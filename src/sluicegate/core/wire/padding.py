"""Size padding of stream frames: every frame's size is a step of a ladder.

Through TLS an observer sees the size of each record, and one SSE event per
token makes that size the token's length plus a constant. ``FramePadder`` gives
every frame of one response a size that depends only on which step of a ladder
its variable part falls in, not on its text:

- the **floor** is the size of the response's smallest content frame (choice 0,
  empty text, empty pad field): the constant that the id, model name, usage
  option and field names add to every frame;
- a frame's **extra** is its size minus the floor (negative for a finish chunk,
  which has no content key); it is padded to ``floor + step(extra)``, where
  ``step`` is ``MIN_STEP_BYTES`` (16) for every extra up to 16 bytes and the next
  power of two above that.

So role chunks, content chunks whose text's JSON is at most 16 bytes (almost
every token of a real vocabulary), finish chunks whatever their reason, and the
usage chunk whatever its counts all have exactly one size; a heartbeat comment
is padded to that size too, so that it looks like a token. Longer texts (several
tokens coalesced, a long whitespace token) move up one step at a time, which
tells an observer only the power of two of their length.

The pad is the OpenAI-compatible ``obfuscation`` field, the last key of the
chunk object; its value is random characters from ``FILL_ALPHABET`` (64 ASCII
letters, digits, ``-`` and ``_``: JSON needs no escape for them), drawn from a
``random.Random`` seeded by the caller (the server seeds each stream from the
operating system's CSPRNG). Random rather than constant characters keep a
compressing proxy from shrinking the pad back to nothing.

Deliberate divergences: OpenAI pads with a random length per delta, which only
blurs each size; a fixed step hides it. ``[DONE]`` is never padded (it is the
same 14 bytes in every stream).

Spec: OpenAI API reference, "Create chat completion",
``stream_options.include_obfuscation``.
"""

from __future__ import annotations

import random
from typing import Any

from sluicegate.core.events import Usage
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    completion_chunk,
    dumps,
)
from sluicegate.core.wire.sse import encode_event

__all__ = [
    "FILL_ALPHABET",
    "MIN_STEP_BYTES",
    "PAD_FIELD",
    "EventPadder",
    "Filler",
    "FramePadder",
    "content_chunk",
    "frame_floor",
    "split_padded_frame",
    "step_bytes",
    "typed_event",
]

PAD_FIELD = "obfuscation"
"""The chunk field that carries the pad (OpenAI's name; clients ignore it)."""

MIN_STEP_BYTES = 16
"""The ladder's first step (bytes): extras up to this size share one size."""

FILL_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
"""The 64 characters of a pad; each random byte maps to one (256 = 4 * 64)."""

_TABLE = bytes(FILL_ALPHABET[b % 64] for b in range(256))
_POOL_BYTES = 4096
_FIRST_POOL_BYTES = 256
_COMMENT_HEAD = b": keep-alive "
# Stands for the pad of a padded content frame: the chunk's last string value.
_PAD_MARK = "\x00sluicegate:pad\x00"
_TEXT_MARK = "\x00sluicegate:text\x00"


def step_bytes(extra: int, min_step: int = MIN_STEP_BYTES) -> int:
    """The ladder step that holds ``extra`` bytes over the floor (bytes).

    ``min_step`` (a power of two) for ``extra <= min_step`` (negative included),
    else the smallest power of two ``>= extra``.
    """
    if extra <= min_step:
        return min_step
    return 1 << (extra - 1).bit_length()


class Filler:
    """Random pad characters from a seeded fast generator (``FILL_ALPHABET``).

    Args:
        seed: the generator's seed; the server passes 128 bits from the
            operating system's CSPRNG, tests a fixed number.

    Characters are cut from a pool of ``random.Random.randbytes`` mapped through
    one table, so a token's pad costs one slice. The first pool is small
    (``_FIRST_POOL_BYTES``) and each refill doubles it up to ``_POOL_BYTES``:
    most streams are short, and a 4 KiB pool drawn for each one's first frame
    was a measurable part of what a request costs.
    """

    __slots__ = ("_next", "_pool", "_pos", "_random")

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._pool = b""
        self._pos = 0
        self._next = _FIRST_POOL_BYTES  # the next pool's size

    def take(self, n: int) -> bytes:
        """``n`` (>= 0) random characters of ``FILL_ALPHABET``."""
        pos = self._pos
        end = pos + n
        if end > len(self._pool):
            size = self._next
            self._next = min(2 * size, _POOL_BYTES)
            if n > size:
                return self._random.randbytes(n).translate(_TABLE)
            self._pool = self._random.randbytes(size).translate(_TABLE)
            pos, end = 0, n
        self._pos = end
        return self._pool[pos:end]


class FramePadder:
    """Pads the frames of one response to ``floor + step_bytes(extra)`` bytes.

    Args:
        filler: where the pad characters come from.
        floor: the size of the response's smallest content frame, with an
            empty pad field (bytes, > 4).
        min_step: the ladder's first step (bytes, a power of two): a stream on
            a clock, whose events carry several tokens, takes a larger one.
    """

    __slots__ = ("_filler", "_floor", "_min_step")

    def __init__(
        self, filler: Filler, floor: int, min_step: int = MIN_STEP_BYTES
    ) -> None:
        self._filler = filler
        self._floor = floor
        self._min_step = min_step

    def fill(self, size: int) -> bytes:
        """The pad of a frame of ``size`` bytes with an empty pad field: with it,
        the frame has ``floor + step_bytes(size - floor)`` bytes."""
        step = step_bytes(size - self._floor, self._min_step)
        return self._filler.take(self._floor + step - size)

    def frame(self, payload: dict[str, Any]) -> bytes:
        """One SSE event of ``payload`` with its pad field last.

        Args:
            payload: a chunk or error object; ``PAD_FIELD`` is set on it (the
                dict is changed).

        Returns:
            ``data: {..., "obfuscation": "<pad>"}\\n\\n`` of
            ``floor + step_bytes(extra)`` bytes.

        Raises:
            TypeError: ``payload`` holds what JSON cannot encode.
        """
        payload[PAD_FIELD] = ""
        raw = dumps(payload)
        size = len(raw) + 8  # "data: " and the blank line
        return b"data: " + raw[:-2] + self.fill(size) + b'"}\n\n'

    def comment(self) -> bytes:
        """A ``: keep-alive <pad>`` comment the size of a one-token frame."""
        size = self._floor + self._min_step
        pad = self._filler.take(size - len(_COMMENT_HEAD) - 2)
        return _COMMENT_HEAD + pad + b"\n\n"


class EventPadder:
    """Pads the typed events (``event:`` then ``data:``) of one Responses or
    Messages stream, with the same ``obfuscation`` field and ladder:

    - a delta event (one that carries a piece of text or of a call's
      arguments) to the size of the same event with empty text, plus
      ``step_bytes`` of its text's JSON: deltas of up to ``min_step`` bytes all
      have one size, as in ``FramePadder``;
    - any other event (items opening and closing, the terminal event with the
      whole output) to the next power of two of its size: it tells an observer
      only that power of two;
    - a heartbeat (``keep_alive``, ``like_delta``) to the size of the last delta
      event, so that it looks like a token.

    Args:
        filler: where the pad characters come from.
        min_step: the ladder's first step (bytes, a power of two).
    """

    __slots__ = ("_delta_size", "_filler", "_min_step")

    def __init__(self, filler: Filler, min_step: int = MIN_STEP_BYTES) -> None:
        self._filler = filler
        self._min_step = min_step
        self._delta_size = 0

    def event(
        self, kind: str, payload: dict[str, Any], text: str | None = None
    ) -> bytes:
        """``event: kind`` and ``payload``'s JSON, padded (``PAD_FIELD`` is set
        on ``payload``, last).

        Args:
            text: the delta's text when the event is a delta, else ``None``.
        """
        head, raw = self._encode(kind, payload)
        size = len(head) + len(raw) + 2
        if text is not None:
            return head + raw[:-2] + self.delta_pad(size, len(dumps(text))) + b'"}\n\n'
        target = 1 << (size - 1).bit_length()
        return head + raw[:-2] + self._filler.take(target - size) + b'"}\n\n'

    def delta_pad(self, size: int, text_bytes: int) -> bytes:
        """The pad of a delta event of ``size`` bytes with an empty pad field,
        whose text's JSON has ``text_bytes`` bytes: with it, the event has the
        size of the same event with empty text plus ``step_bytes`` of its text
        (the size heartbeats take from here on)."""
        floor = size - text_bytes + 2
        target = floor + step_bytes(size - floor, self._min_step)
        self._delta_size = target
        return self._filler.take(target - size)

    def like_delta(self, kind: str, payload: dict[str, Any]) -> bytes:
        """A heartbeat event padded to the last delta's size (to a power of two
        of its own before any delta, or when it is larger)."""
        head, raw = self._encode(kind, payload)
        size = len(head) + len(raw) + 2
        target = self._delta_size
        if target < size:
            target = 1 << (size - 1).bit_length()
        return head + raw[:-2] + self._filler.take(target - size) + b'"}\n\n'

    def keep_alive(self) -> bytes:
        """A ``: keep-alive <pad>`` comment of the last delta's size (256 bytes
        before any delta)."""
        size = self._delta_size or 256
        pad = self._filler.take(size - len(_COMMENT_HEAD) - 2)
        return _COMMENT_HEAD + pad + b"\n\n"

    @staticmethod
    def _encode(kind: str, payload: dict[str, Any]) -> tuple[bytes, bytes]:
        payload[PAD_FIELD] = ""
        return b"event: " + kind.encode() + b"\ndata: ", dumps(payload)


def typed_event(kind: str, payload: dict[str, Any]) -> bytes:
    """One typed event of the Responses or Messages API, unpadded: ``event:
    kind``, then ``payload``'s compact JSON on one ``data:`` line, then a blank
    line (``EventPadder.event`` is the padded one).

    Raises:
        TypeError: ``payload`` holds what JSON cannot encode.
    """
    return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


def content_chunk(
    header: ResponseHeader, index: int, text: str, usage: Usage | None = None
) -> dict[str, Any]:
    """A content chunk of choice ``index`` carrying ``text`` (chat or completions,
    as ``header.endpoint`` says)."""
    if header.endpoint is Endpoint.CHAT:
        return chat_chunk(header, index, {"content": text}, usage=usage)
    return completion_chunk(header, index, text, usage=usage)


def frame_floor(header: ResponseHeader) -> int:
    """The unpadded size of the response's smallest content frame (bytes): choice
    0, empty text, an empty pad field, and the usage of no tokens yet when every
    chunk carries usage."""
    usage = Usage(header.prompt_tokens, 0) if header.continuous_usage else None
    payload = content_chunk(header, 0, "", usage)
    payload[PAD_FIELD] = ""
    return len(encode_event(dumps(payload)))


def split_padded_frame(
    header: ResponseHeader, index: int
) -> tuple[bytes, bytes, bytes, int]:
    """``(before, between, after, size)``: ``before + dumps(text) + between + pad
    + after`` is the padded content frame of choice ``index``, the same bytes as
    ``FramePadder.frame`` of its chunk with that pad (property-tested); ``size``
    is its length without the text and the pad (bytes).

    The pad is the chunk's last string value and the text the one before it
    (see ``StreamMachine``'s unpadded split): splitting at the last marker of
    each is exact.
    """
    payload = content_chunk(header, index, _TEXT_MARK)
    payload[PAD_FIELD] = _PAD_MARK
    head, _, after = encode_event(dumps(payload)).rpartition(dumps(_PAD_MARK))
    before, _, between = head.rpartition(dumps(_TEXT_MARK))
    between += b'"'
    after = b'"' + after
    return before, between, after, len(before) + len(between) + len(after)
