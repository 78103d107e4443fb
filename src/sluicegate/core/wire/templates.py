"""Frames from templates: per stream, the bytes around a token's text are built once.

Every content event of one stream is the same bytes but for its text (on the
Responses API also its sequence number; with continuous usage also its usage's
counts; padded, also its pad). A template encodes the event once with markers in
those places and keeps the bytes between them, so a token costs the JSON of its
text (and of its counts) and one join:

::

    unpadded   head [+ number + middle] + dumps(text) + tail
    padded     head [+ number + middle] + dumps(text) + between + pad + tail
    usage      head + dumps(text) + middle + counts [+ between + pad] + tail

``ChoiceFrames`` holds the content chunks of a chat or completions stream (one
per open choice); ``EventTemplate`` one kind of typed event of the Responses or
Messages API (a text delta of one output item or content block). The frames are
byte for byte those of the plain path (``encode_event(dumps(chunk))``,
``FramePadder.frame``, ``EventPadder.event``), property-tested for any text.

Why the split is exact: the text is the payload's last string value before the
pad (what follows it is ``null``, numbers or ``[]``), so the last occurrence of
its marker's JSON is the text's whatever an id or a model name holds; the usage
object is the chunk's last value but the pad, after the text; the pad is
the payload's last value; the sequence number is the value right after the
event's ``type``, a fixed name, so its marker's first occurrence is it.
"""

from __future__ import annotations

from typing import Any

from sluicegate.core.events import Usage
from sluicegate.core.wire.chunks import MAX_INT, ResponseHeader, dumps
from sluicegate.core.wire.padding import (
    PAD_FIELD,
    EventPadder,
    Filler,
    FramePadder,
    content_chunk,
    split_padded_frame,
    typed_event,
)
from sluicegate.core.wire.sse import encode_event

__all__ = ["NUMBER_MARK", "TEXT_MARK", "ChoiceFrames", "EventTemplate"]

TEXT_MARK = "\x00sluicegate:text\x00"
"""Stands for the text in a payload given to ``EventTemplate``."""
NUMBER_MARK = "\x00sluicegate:number\x00"
"""Stands for the sequence number in a numbered payload."""
_PAD_MARK = "\x00sluicegate:pad\x00"
_USAGE_MARK = "\x00sluicegate:usage\x00"
_COUNTS = b'%d,"completion_tokens":%d,"total_tokens":%d'


class ChoiceFrames:
    """The content frames of a chat or completions stream's open choices.

    Args:
        header: the response's shared fields (``n`` choices, chat or completions).
        padder: pads every frame (``FramePadder``), or ``None``.

    ``frame(index, text)`` is the content chunk of choice ``index`` carrying
    ``text`` (no logprobs, no usage, no parts), the same bytes as
    ``encode_event(dumps(content_chunk(...)))`` (padded: as ``FramePadder.frame``);
    ``usage_frame(index, text, usage)`` the same chunk with ``usage`` (continuous
    usage), as ``content_chunk(..., usage)`` is encoded.
    """

    __slots__ = ("_filler", "_header", "_padded", "_padder", "_plain", "_usage")

    def __init__(self, header: ResponseHeader, padder: FramePadder | None) -> None:
        self._header = header
        self._padder = padder
        # Per choice, built at its first usage frame: before, middle (up to the
        # prompt's count), between (after the usage, up to the pad; unpadded
        # the frame's end), after (the pad's end) and their size.
        self._usage: dict[int, tuple[bytes, bytes, bytes, bytes, int]] = {}
        self._plain: dict[int, tuple[bytes, bytes]] = {}
        # Per choice: before, between, after, the frame's size without text
        # and pad, and the room left in the ladder's first step by those bytes
        # (``FramePadder.fill``): a text's JSON up to that size fits it.
        self._padded: dict[int, tuple[bytes, bytes, bytes, int, int]] = {}
        if padder is None:
            self._plain = {i: _split_chunk(header, i) for i in range(header.n)}
        else:
            self._filler: Filler = padder._filler
            for i in range(header.n):
                before, between, after, size = split_padded_frame(header, i)
                first = padder._floor + padder._min_step - size
                self._padded[i] = (before, between, after, size, first)

    def frame(self, index: int, text: str) -> bytes | None:
        """Choice ``index``'s content frame of ``text``: ``b""`` for empty text
        (nothing to send), ``None`` when that choice is not open (never was, or
        ``close``d).

        Raises:
            TypeError: ``text`` has a lone surrogate.
        """
        padder = self._padder
        if padder is None:
            plain = self._plain.get(index)
            if plain is None:
                return None
            if not text:
                return b""
            return plain[0] + dumps(text) + plain[1]
        padded = self._padded.get(index)
        if padded is None:
            return None
        if not text:
            return b""
        before, between, after, size, first = padded
        raw = dumps(text)
        # Once per token: a text whose frame takes the ladder's first step
        # (almost every token) is padded to it with the filler's pool cut
        # here, ``fill`` without its calls; the same characters either way.
        room = first - len(raw)
        if room >= 0:
            filler = self._filler
            pos = filler._pos
            end = pos + room
            pool = filler._pool
            if end <= len(pool):
                filler._pos = end
                return b"".join((before, raw, between, pool[pos:end], after))
        return b"".join((before, raw, between, padder.fill(size + len(raw)), after))

    def usage_frame(self, index: int, text: str, usage: Usage) -> bytes | None:
        """Choice ``index``'s content frame of ``text`` with ``usage`` after its
        choices: ``b""`` for empty text, ``None`` when that choice is not open
        or a count is negative or past ``chunks.MAX_INT`` (which ``dumps``
        clamps: the caller builds that chunk whole).

        Raises:
            TypeError: ``text`` has a lone surrogate.
        """
        parts = self._usage.get(index)
        if parts is None:
            if index not in self._plain and index not in self._padded:
                return None
            parts = self._usage[index] = _split_usage_chunk(
                self._header, index, self._padder is not None
            )
        if not text:
            return b""
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        if prompt < 0 or completion < 0 or prompt + completion > MAX_INT:
            return None
        # Once per token: three integers in one format, the text's JSON, a join.
        counts = _COUNTS % (prompt, completion, prompt + completion)
        reasoning, cached = usage.reasoning_tokens, usage.cached_tokens
        if reasoning is not None or cached:
            details = _details(reasoning, cached)
            if details is None:
                return None
            counts += details
        before, middle, between, after, size = parts
        raw = dumps(text)
        padder = self._padder
        if padder is None:
            return b"".join((before, raw, middle, counts, between))
        pad = padder.fill(size + len(raw) + len(counts))
        return b"".join((before, raw, middle, counts, between, pad, after))

    def close(self, index: int) -> None:
        """Choice ``index`` finished: no more content frames for it."""
        self._plain.pop(index, None)
        self._padded.pop(index, None)
        self._usage.pop(index, None)


def _details(reasoning: int | None, cached: int) -> bytes | None:
    """The usage's details after its totals, as ``chunks.usage_dict`` orders
    them; ``None`` for a count outside ``0..MAX_INT``."""
    out = b""
    if reasoning is not None:
        if not 0 <= reasoning <= MAX_INT:
            return None
        out = b',"completion_tokens_details":{"reasoning_tokens":%d}' % reasoning
    if cached:
        if not 0 <= cached <= MAX_INT:
            return None
        out += b',"prompt_tokens_details":{"cached_tokens":%d}' % cached
    return out


def _split_usage_chunk(
    header: ResponseHeader, index: int, padded: bool
) -> tuple[bytes, bytes, bytes, bytes, int]:
    """``(before, middle, between, after, size)``: ``before + dumps(text) +
    middle + counts + between [+ pad + after]`` is choice ``index``'s content
    frame with a usage (``counts`` the prompt's count on, up to the usage
    object's closing brace, which ``between`` starts with); ``size`` their
    length without text, counts and pad (bytes)."""
    payload = content_chunk(header, index, TEXT_MARK)
    payload["usage"] = _USAGE_MARK  # where ``_chunk`` puts a usage: after choices
    if padded:
        payload[PAD_FIELD] = _PAD_MARK
    frame = encode_event(dumps(payload))
    after = b""
    if padded:
        frame, _, after = frame.rpartition(dumps(_PAD_MARK))
        after = b'"' + after
    head, _, between = frame.rpartition(dumps(_USAGE_MARK))
    before, _, middle = head.rpartition(dumps(TEXT_MARK))
    middle += b'{"prompt_tokens":'
    between = b"}" + between + (b'"' if padded else b"")
    return before, middle, between, after, len(before + middle + between + after)


def _split_chunk(header: ResponseHeader, index: int) -> tuple[bytes, bytes]:
    """``(before, after)`` with ``before + dumps(text) + after`` the unpadded
    content frame of choice ``index``."""
    frame = encode_event(dumps(content_chunk(header, index, TEXT_MARK)))
    before, _, after = frame.rpartition(dumps(TEXT_MARK))
    return before, after


class EventTemplate:
    """One kind of typed event, its text (and sequence number) left open.

    Args:
        kind: the event's name (its ``event:`` line).
        payload: its JSON object with ``TEXT_MARK`` as the text and, numbered,
            ``NUMBER_MARK`` as the value right after ``type``; not changed.
        padder: pads the event as ``EventPadder.event`` pads a delta, or
            ``None``.

    ``frame(text, number)`` is the same bytes as ``EventPadder.event(kind,
    payload with text and number, text)`` (``padding.typed_event`` unpadded).
    """

    __slots__ = (
        "_between",
        "_fixed",
        "_head",
        "_middle",
        "_numbered",
        "_padder",
        "_tail",
    )

    def __init__(
        self, kind: str, payload: dict[str, Any], padder: EventPadder | None
    ) -> None:
        fields = dict(payload)
        if padder is not None:
            fields[PAD_FIELD] = _PAD_MARK
        frame = typed_event(kind, fields)
        head, _, tail = frame.rpartition(dumps(TEXT_MARK))
        self._between = b""
        if padder is not None:
            between, _, tail = tail.rpartition(dumps(_PAD_MARK))
            self._between, tail = between + b'"', b'"' + tail
        self._numbered = NUMBER_MARK in fields.values()
        self._middle = b""
        if self._numbered:
            head, _, self._middle = head.partition(dumps(NUMBER_MARK))
        self._head = head
        self._padder = padder
        self._fixed = len(head) + len(self._middle) + len(self._between) + len(tail)
        self._tail = tail

    def frame(self, text: str, number: int = 0) -> bytes:
        """The event carrying ``text``, numbered ``number`` if it is numbered.

        Raises:
            TypeError: ``text`` has a lone surrogate.
        """
        raw = dumps(text)
        seq = str(number).encode() if self._numbered else b""
        padder = self._padder
        if padder is None:
            return b"".join((self._head, seq, self._middle, raw, self._tail))
        pad = padder.delta_pad(self._fixed + len(seq) + len(raw), len(raw))
        parts = (self._head, seq, self._middle, raw, self._between, pad, self._tail)
        return b"".join(parts)
