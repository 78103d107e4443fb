"""Server-sent events: encoder and strict decoder.

The encoder writes one event per call: each line of the data as a ``data:`` field,
then a blank line. Lines are split on CR, LF and CRLF only (the three line ends of
the event-stream grammar), so a payload can never end an event early or start a
forged one: decoding ``encode_event(x)`` gives back ``x`` for any text, with each
CR and CRLF turned into LF (the grammar cannot carry them). A JSON payload from
``chunks.dumps`` escapes CR and LF, so it comes back exactly.

The decoder follows the WHATWG "Interpreting an event stream" algorithm: bytes in
any split, strict UTF-8, one leading BOM dropped, lines ended by CRLF, LF or CR (a
CR at the end of one ``feed`` and an LF at the start of the next are one line
end), fields ``data``, ``event``, ``id`` and ``retry``, comments counted and
otherwise ignored, an event dispatched on each blank line.

Deliberate divergences:

- Events without any ``data`` field (``event: ping\\n\\n``) are not dispatched,
  as WHATWG says; httpx-sse and the openai client dispatch them with empty data.
- ``retry`` is reported on the ``Event`` of the block that carried it (as
  httpx-sse does) instead of only changing a reconnection time.
- An incomplete UTF-8 character at end of stream counts as truncation (the event
  is discarded, as every incomplete event is), not as invalid UTF-8.
- A ``retry`` of more than 18 digits is ignored, as one that is not a number
  is (it would be a reconnection time of over 30 million years).
- With ``max_line_bytes`` or ``max_event_bytes`` set, a line or an event's data
  past its bound is an error (the spec sets no bound): what the decoder holds
  between two ``feed`` calls stays within them.

Spec: WHATWG HTML, "9.2.6 Interpreting an event stream".
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError

__all__ = ["DONE", "Event", "SSEDecoder", "encode_comment", "encode_event"]

DONE: bytes = b"data: [DONE]\n\n"
"""The OpenAI end-of-stream sentinel event (``[DONE]`` is not JSON)."""

_BYTE_LINE_END = re.compile(rb"\r\n|\r|\n")
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event.

    Attributes:
        data: the data buffer, lines joined by LF, without the final LF.
        event: the event type; ``"message"`` when no ``event`` field was given.
        id: the last event ID seen so far in the stream (it carries over to later
            events, per spec), or ``None`` if no ``id`` field has been seen yet.
        retry: the reconnection time (milliseconds) set in this event's block, or
            ``None``.
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


def encode_event(data: str | bytes) -> bytes:
    """Encode one event whose data is ``data``.

    Args:
        data: text, or its UTF-8 bytes. CR, LF and CRLF each end a line; every line
            becomes its own ``data:`` field. Other separators (U+2028, NUL, form
            feed) are ordinary characters here. ``""`` gives one empty ``data:``
            line, which decodes to an event with empty data.

    Returns:
        ``data: <line>\\n`` per line, then ``\\n``: one complete event.

    Raises:
        UnicodeEncodeError: ``data`` is a ``str`` with a lone surrogate.

    Spec: WHATWG HTML, "9.2.5 Parsing an event stream".
    """
    raw = data.encode() if isinstance(data, str) else data
    if b"\n" not in raw and b"\r" not in raw:
        return b"data: " + raw + b"\n\n"
    lines = _BYTE_LINE_END.split(raw)
    return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"


def encode_comment(text: str = "keep-alive") -> bytes:
    """An SSE comment line (``: text\\n\\n``), used as a heartbeat.

    The blank line after it dispatches nothing (no data was set), so clients that
    read the stream ignore it, while proxies see bytes moving.

    Raises:
        ValueError: ``text`` contains CR or LF (it would end the comment).
        UnicodeEncodeError: ``text`` has a lone surrogate.
    """
    if "\n" in text or "\r" in text:
        raise ValueError(f"an SSE comment cannot contain a line end, got {text!r}")
    return b": " + text.encode() + b"\n\n"


class SSEDecoder:
    """Bytes in (any split), events out; strict UTF-8.

    Feed the body as it arrives with ``feed``; call ``flush`` once at end of
    stream. After ``flush`` or after an error, further calls raise
    ``LocalProtocolError``.

    Args:
        max_line_bytes: the longest line (UTF-8 bytes, its line end not
            counted); ``None``: no bound. A longer one is an error as soon as
            its bytes so far pass the bound, so an unterminated line never
            holds more.
        max_event_bytes: the most data of one event (UTF-8 bytes of its data
            buffer, the LF between its lines counted); ``None``: no bound.

    Raises:
        ValueError: a bound below 1.
    """

    __slots__ = (
        "_closed",
        "_comments",
        "_data",
        "_data_bytes",
        "_decoder",
        "_discarded",
        "_event_type",
        "_last_id",
        "_line",
        "_line_bytes",
        "_max_event",
        "_max_line",
        "_retry",
        "_skip_lf",
        "_started",
    )

    def __init__(
        self, max_line_bytes: int | None = None, max_event_bytes: int | None = None
    ) -> None:
        for name, bound in (
            ("max_line_bytes", max_line_bytes),
            ("max_event_bytes", max_event_bytes),
        ):
            if bound is not None and bound < 1:
                raise ValueError(f"expected {name} >= 1 or None, got {bound!r}")
        self._max_line = max_line_bytes
        self._max_event = max_event_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._started = False  # whether the first character (a BOM?) was seen
        self._skip_lf = False  # the last line ended in CR: a leading LF ends it too
        self._line: list[str] = []  # the current line, not yet terminated
        self._line_bytes = 0  # its UTF-8 bytes (kept only with a bound)
        self._data: list[str] = []
        self._data_bytes = 0  # the data buffer's UTF-8 bytes (only with a bound)
        self._event_type = ""
        self._last_id: str | None = None
        self._retry: int | None = None
        self._closed = False
        self._discarded = False
        self._comments = 0

    @property
    def comments(self) -> int:
        """Comment lines seen so far; a heartbeat (``: keep-alive``) is activity."""
        return self._comments

    @property
    def pending(self) -> bool:
        """Whether anything fed is not yet dispatched.

        ``True`` after a partial line, an incomplete UTF-8 character, or fields of
        an event whose blank line has not come yet; ``False`` between events.
        """
        return bool(
            self._line
            or self._data
            or self._event_type
            or self._retry is not None
            or self._decoder.getstate()[0]
        )

    @property
    def held_bytes(self) -> int:
        """UTF-8 bytes held between two ``feed`` calls: the unterminated line
        and the data of the event not yet dispatched (its LFs counted)."""
        data = sum(_utf8_len(v) for v in self._data) + max(len(self._data) - 1, 0)
        return sum(_utf8_len(p) for p in self._line) + data

    @property
    def discarded(self) -> bool:
        """Whether ``flush`` dropped an incomplete event (the stream was cut)."""
        return self._discarded

    def feed(self, data: bytes) -> list[Event]:
        """Decode the next bytes of the body.

        Args:
            data: any number of bytes, split anywhere (even inside a character or
                between the CR and LF of a line end).

        Returns:
            The events completed by these bytes, in order (possibly none).

        Raises:
            RemoteProtocolError: the bytes are not valid UTF-8, or a line or an
                event passes its bound. Events completed earlier in the same
                ``data`` are lost with it; the decoder is closed.
            LocalProtocolError: after ``flush()`` or after an error.
        """
        if self._closed:
            raise LocalProtocolError("SSEDecoder.feed() after flush() or an error")
        try:
            text: str = self._decoder.decode(data)
        except UnicodeDecodeError as exc:
            self._closed = True
            raise RemoteProtocolError(
                f"the event stream is not valid UTF-8: {exc.reason} at byte "
                f"{exc.start} of the chunk fed"
            ) from exc
        if not text:
            return []
        if not self._started:
            self._started = True
            if text[0] == "\ufeff":
                text = text[1:]
        if self._skip_lf and text:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        if "\n" not in text and "\r" not in text:
            if text:
                if self._max_line is not None:
                    self._hold(text, self._max_line)
                self._line.append(text)
            return []
        lines = _LINE_END.split(text)
        if self._line:
            self._line.append(lines[0])
            lines[0] = "".join(self._line)
            self._line.clear()
            self._line_bytes = 0
        rest = lines.pop()
        max_line = self._max_line
        if max_line is not None:
            for line in lines:
                if len(line) * 4 > max_line and _utf8_len(line) > max_line:
                    self._fail(f"a line longer than {max_line} bytes")
        if rest:
            if max_line is not None:
                self._hold(rest, max_line)
            self._line.append(rest)
        elif text[-1] == "\r":
            self._skip_lf = True
        events: list[Event] = []
        for line in lines:
            event = self._process_line(line)
            if event is not None:
                events.append(event)
        return events

    def flush(self) -> list[Event]:
        """End of stream: discard an incomplete event, per spec, and end the object.

        Returns:
            ``[]`` always (an event without its blank line is never dispatched);
            ``discarded`` tells whether one was dropped.

        Raises:
            LocalProtocolError: called twice, or after an error.
        """
        if self._closed:
            raise LocalProtocolError("SSEDecoder.flush() called twice or after error")
        self._discarded = self.pending
        self._closed = True
        return []

    def _hold(self, piece: str, bound: int) -> None:
        """Count ``piece`` into the unterminated line; fail past ``bound``."""
        self._line_bytes += _utf8_len(piece)
        if self._line_bytes > bound:
            self._fail(f"a line longer than {bound} bytes")

    def _grow_data(self, value: str, bound: int) -> None:
        """Count ``value`` into the event's data buffer; fail past ``bound``.

        The buffer is the values joined by LF: each value adds its bytes and,
        after the first, one LF.
        """
        self._data_bytes += _utf8_len(value) + (1 if self._data else 0)
        if self._data_bytes > bound:
            self._fail(f"an event with more than {bound} bytes of data")

    def _fail(self, what: str) -> None:
        self._closed = True
        self._line.clear()
        self._data.clear()
        raise RemoteProtocolError(f"the event stream has {what}")

    def _process_line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            self._comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        match name:
            case "data":
                if self._max_event is not None:
                    self._grow_data(value, self._max_event)
                self._data.append(value)
            case "event":
                self._event_type = value
            case "id" if "\0" not in value:
                self._last_id = value
            case "retry" if value.isascii() and value.isdigit() and len(value) < 19:
                self._retry = int(value)
            case _:
                pass  # other field names, and ids with NUL, are ignored per spec
        return None

    def _dispatch(self) -> Event | None:
        event: Event | None = None
        if self._data:
            event = Event(
                data="\n".join(self._data),
                event=self._event_type or "message",
                id=self._last_id,
                retry=self._retry,
            )
        self._data.clear()
        self._data_bytes = 0
        self._event_type = ""
        self._retry = None
        return event


def _utf8_len(text: str) -> int:
    """UTF-8 bytes of ``text`` (decoded strictly, so it has no lone surrogate)."""
    return len(text) if text.isascii() else len(text.encode())
