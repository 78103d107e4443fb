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

    """

    __slots__ = (
        "_closed",
        "_comments",
        "_data",
        "_decoder",
        "_discarded",
        "_event_type",
        "_last_id",
        "_line",
        "_retry",
        "_skip_lf",
        "_started",
    )

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._started = False  # whether the first character (a BOM?) was seen
        self._skip_lf = False  # the last line ended in CR: a leading LF ends it too
        self._line: list[str] = []  # the current line, not yet terminated
        self._data: list[str] = []
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
            RemoteProtocolError: the bytes are not valid UTF-8. Events completed
                earlier in the same ``data`` are lost with it; the decoder is
                closed.
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
                self._line.append(text)
            return []
        lines = _LINE_END.split(text)
        if self._line:
            self._line.append(lines[0])
            lines[0] = "".join(self._line)
            self._line.clear()
        rest = lines.pop()
        if rest:
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
                self._data.append(value)
            case "event":
                self._event_type = value
            case "id" if "\0" not in value:
                self._last_id = value
            case "retry" if value.isascii() and value.isdigit():
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
        self._event_type = ""
        self._retry = None
        return event
