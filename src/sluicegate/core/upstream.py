"""An upstream server's OpenAI event stream in; per-choice text, finishes, usage out.

``UpstreamReader`` reads the body of a streamed ``/chat/completions`` or
``/completions`` response from an OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp's server, Ollama, sluicegate itself), as bytes in any split, and turns
it into a few plain values: ``UpstreamDelta`` (new text of one choice),
``UpstreamToolCall`` (a fragment of one of its tool calls, normalized by
``core/upstream_tools.py``), ``UpstreamFinish``, ``Usage`` (each time it
changes), ``UpstreamError`` (an
in-band error, or a stream that breaks the protocol), ``UpstreamDone`` (the first
``[DONE]``) and, from ``flush()``, ``UpstreamTruncated`` (the body ended without
``[DONE]``). What the gateway sends its own client is built from these values
by its own core, so none of an upstream's quirks travel on.

Quirks absorbed (each one seen in a real server or its issue tracker):

- usage on every chunk (continuous usage) or only on a last chunk with
  ``choices: []``: a ``Usage`` item only when the counts change;
- ``finish_reason: ""`` (read as none), a ``finish_reason`` repeated on later
  chunks (one ``UpstreamFinish`` per choice), text after a choice's finish
  (dropped);
- a doubled ``[DONE]`` and anything after the first one (ignored);
- keep-alive comment lines, named ``event:`` lines other than ``error``, CRLF or
  CR line ends, a leading BOM (the SSE decoder's part);
- the role chunk, empty or ``null`` content, chunks with neither choices nor
  usage;
- text repeated cumulatively (each chunk holding the whole text so far): see
  below;
- in-band errors as ``{"error": {...}}``, ``{"error": "text"}`` (TGI) or
  ``{"object": "error", ...}`` (vLLM's error object), with or without
  ``event: error``.

Invariants:
    - Whatever way the body is split into ``feed()`` calls, the items of all
      calls plus ``flush()`` are the same (property-tested), invalid UTF-8 apart
      (the SSE decoder loses the events of the chunk it fails in).
    - Nothing follows an ``UpstreamError`` or ``UpstreamDone``; ``flush()``
      returns ``[UpstreamTruncated()]`` exactly when neither was returned.
    - Per choice, the ``UpstreamDelta`` texts are the choice's text, each
      non-empty, and come before its one ``UpstreamFinish``; so do its
      ``UpstreamToolCall`` fragments (a call's start held for its name goes
      out before the finish, or before an error or the truncation).
    - A choice that made tool calls finishes ``TOOL_CALLS`` unless the
      upstream said ``length`` or a call's arguments are not whole JSON (a
      call cut short is never reported as made): then ``LENGTH`` when the
      upstream said ``tool_calls`` (llama-cpp-python says so when
      ``max_tokens`` cuts a call), else ``STOP`` (the call ended on its own,
      as the local engine reports it). One that made none never finishes
      ``TOOL_CALLS``.

Cumulative text: a choice is taken to repeat its text cumulatively when its
second non-empty text is longer than its first and starts with it, and its
third starts with the second. An ambiguous second text (it starts with the
first) is held back until the third text, the choice's finish or the stream's
end settles it (at a finish or end it counts as cumulative); from then on a
cumulative choice sends only what is new after the text so far (a text that
does not start with it is sent whole). A plain stream pays for this only on its
first two texts.

Deliberate divergences:

- A ``finish_reason`` other than ``length`` and ``max_tokens`` is reported as
  ``FinishReason.STOP``, or ``TOOL_CALLS`` when the choice made calls, whatever
  the upstream's word (``UpstreamFinish.raw`` keeps it), except ``abort`` and
  ``error``, which are an ``UpstreamError``.
- Data that is not JSON, or JSON that is not an object, is an
  ``UpstreamError`` (code ``upstream_protocol_error``), not an exception: for
  the gateway it ends the stream like any other upstream failure.

Spec: OpenAI API reference, "The chat completion chunk object", "Create
completion" (streaming) and "Error codes"; WHATWG HTML, "9.2.6 Interpreting an
event stream" (through ``SSEDecoder``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from sluicegate.core.chunks import Endpoint
from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError, bounded_repr
from sluicegate.core.events import FinishReason, ToolCallFragment, Usage
from sluicegate.core.sse import Event, SSEDecoder
from sluicegate.core.toolcalls import new_call_id
from sluicegate.core.upstream_tools import ToolCallNormalizer

__all__ = [
    "PROTOCOL_ERROR_CODE",
    "ReaderState",
    "UpstreamDelta",
    "UpstreamDone",
    "UpstreamError",
    "UpstreamFinish",
    "UpstreamItem",
    "UpstreamReader",
    "UpstreamToolCall",
    "UpstreamTruncated",
]

PROTOCOL_ERROR_CODE = "upstream_protocol_error"
"""``UpstreamError.code`` of a stream that is not an OpenAI event stream."""

_LENGTH_REASONS = frozenset({"length", "max_tokens", "model_length"})
_FAILED_REASONS = frozenset({"abort", "error"})


@dataclass(frozen=True, slots=True)
class UpstreamDelta:
    """New text of choice ``index`` (non-empty; only what is new)."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class UpstreamToolCall:
    """A fragment of one of choice ``index``'s tool calls, normalized (chat only).

    ``fragment`` has the local engine's shape: a call's first fragment carries
    its index (from 0), id and name with ``arguments == ""``; later ones more of
    its arguments.
    """

    index: int
    fragment: ToolCallFragment


@dataclass(frozen=True, slots=True)
class UpstreamFinish:
    """Choice ``index`` ended; ``raw`` is the upstream's own ``finish_reason``."""

    index: int
    finish_reason: FinishReason
    raw: str


@dataclass(frozen=True, slots=True)
class UpstreamError:
    """An in-band error, or a body that is not an OpenAI event stream.

    Attributes:
        message: the upstream's message, or what was wrong with the body.
        type: the upstream's error type, or ``"server_error"``.
        code: the upstream's code as text (vLLM sends its HTTP status there),
            ``PROTOCOL_ERROR_CODE`` for a broken body, or ``None``.
    """

    message: str
    type: str = "server_error"
    code: str | None = None


@dataclass(frozen=True, slots=True)
class UpstreamDone:
    """The first ``data: [DONE]``: the upstream completed its stream."""


@dataclass(frozen=True, slots=True)
class UpstreamTruncated:
    """The body ended without ``[DONE]`` and without an in-band error.

    Attributes:
        partial: whether an incomplete event was cut off at the end.
    """

    partial: bool = False


UpstreamItem = (
    UpstreamDelta
    | UpstreamToolCall
    | UpstreamFinish
    | Usage
    | UpstreamError
    | UpstreamDone
    | UpstreamTruncated
)
"""What ``UpstreamReader`` returns."""


class ReaderState(StrEnum):
    """Where an ``UpstreamReader`` is."""

    READING = "reading"
    """Events are still expected."""
    DONE = "done"
    """``[DONE]`` came; later bytes are ignored."""
    FAILED = "failed"
    """An ``UpstreamError`` was returned; later bytes are ignored."""
    CLOSED = "closed"
    """``flush()`` was called."""


class _Choice:
    """Cumulative-text detection and finish bookkeeping of one choice."""

    __slots__ = ("finished", "first", "held", "mode", "seen", "tools")

    def __init__(self) -> None:
        self.tools: ToolCallNormalizer | None = None  # at its first tool call
        self.mode: bool | None = None  # cumulative? None: not settled yet
        self.first = ""  # the first non-empty text
        self.held = ""  # an ambiguous second text, held back
        self.seen = ""  # cumulative: the upstream's whole text so far
        self.finished = False

    def feed(self, text: str) -> str:
        """What of ``text`` (non-empty) is new."""
        mode = self.mode
        if mode is False:
            return text
        if mode is True:
            seen = self.seen
            if text.startswith(seen):
                self.seen = text
                return text[len(seen) :]
            self.seen = seen + text
            return text
        if not self.first:
            self.first = text
            return text
        if not self.held:
            if len(text) > len(self.first) and text.startswith(self.first):
                self.held = text
                return ""
            self.mode = False
            return text
        held = self.held
        self.held = ""
        if len(text) >= len(held) and text.startswith(held):
            self.mode = True
            self.seen = text
            return text[len(self.first) :]
        self.mode = False
        return held + text

    def settle(self) -> str:
        """End of the choice's text: a held text counts as cumulative."""
        held = self.held
        if not held:
            return ""
        self.held = ""
        self.mode = True
        self.seen = held
        return held[len(self.first) :]


class UpstreamReader:
    """Bytes of an upstream's streamed response in (any split), items out.

    Args:
        endpoint: which API the stream answers: ``Endpoint.CHAT`` reads
            ``choices[].delta.content`` and ``choices[].delta.tool_calls``,
            ``Endpoint.COMPLETION`` ``choices[].text``.
        new_id: makes the id of a tool call the upstream sent none for.

    Attributes:
        events: data events read so far (``[DONE]`` included).

    After ``flush()`` further calls raise ``LocalProtocolError``.
    """

    __slots__ = (
        "_choices",
        "_decoder",
        "_endpoint",
        "_fast",
        "_new_id",
        "_state",
        "_usage",
        "events",
    )

    def __init__(
        self, endpoint: Endpoint, *, new_id: Callable[[], str] = new_call_id
    ) -> None:
        self._endpoint = endpoint
        self._new_id = new_id
        self._decoder = SSEDecoder()
        # Whether the decoder stands between two events, past the stream's
        # first bytes (its BOM) and not after a CR: then ``_feed_plain`` may read
        # plain events itself.
        self._fast = False
        self._state = ReaderState.READING
        self._choices: dict[int, _Choice] = {}
        self._usage: Usage | None = None
        self.events = 0

    @property
    def state(self) -> ReaderState:
        """Where the reader is."""
        return self._state

    @property
    def usage(self) -> Usage | None:
        """The latest usage the upstream reported, or ``None``."""
        return self._usage

    @property
    def comments(self) -> int:
        """SSE comment lines (keep-alives) read so far."""
        return self._decoder.comments

    def feed(self, data: bytes) -> list[UpstreamItem]:
        """Read the next bytes of the body.

        Args:
            data: any number of bytes, split anywhere.

        Returns:
            The items these bytes complete, in order (often none). Once
            ``[DONE]`` or an error was returned, always ``[]``.

        Raises:
            LocalProtocolError: after ``flush()``.
        """
        state = self._state
        if state is not ReaderState.READING:
            if state is ReaderState.CLOSED:
                raise LocalProtocolError("UpstreamReader.feed() after flush()")
            return []
        out: list[UpstreamItem] = []
        if self._fast:
            start = self._feed_plain(data, out)
            if start == len(data) or self._state is not ReaderState.READING:
                return out
            data = data[start:]
        try:
            events = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            self._fail(out, str(exc), PROTOCOL_ERROR_CODE)
            return out
        self._fast = data[-1:] == b"\n" and not self._decoder.pending
        for event in events:
            self._read(event, out)
            if self._state is not ReaderState.READING:
                break
        return out

    def flush(self) -> list[UpstreamItem]:
        """End of the body.

        Returns:
            ``[UpstreamTruncated(partial)]`` (after the held text of any choice
            that has not finished) when neither ``[DONE]`` nor an error came;
            otherwise ``[]``.

        Raises:
            LocalProtocolError: called twice.
        """
        state = self._state
        if state is ReaderState.CLOSED:
            raise LocalProtocolError("UpstreamReader.flush() called twice")
        self._state = ReaderState.CLOSED
        if state is not ReaderState.READING:
            return []
        self._decoder.flush()
        out: list[UpstreamItem] = []
        self._settle_all(out)
        out.append(UpstreamTruncated(self._decoder.discarded))
        return out

    # -- internals -----------------------------------------------------------

    def _feed_plain(self, data: bytes, out: list[UpstreamItem]) -> int:
        """Read the events at the start of ``data`` that are one ``data: `` line
        each, holding a JSON object or ``[DONE]``, with LF line ends; return
        where the rest begins (``len(data)`` once the stream ended).

        The fast twin of ``SSEDecoder.feed`` + ``_read`` for what upstreams
        send almost always (one event per chunk): no text decoding and no
        ``Event``; orjson checks the UTF-8 itself. Anything else (a comment, a
        CR, another field, more than one line, invalid UTF-8 or JSON) is left
        to the decoder, which stays between two events meanwhile.
        """
        start = 0
        size = len(data)
        while start < size:
            end = data.find(b"\n\n", start)
            if end < 0 or not data.startswith(b"data: ", start):
                return start
            line = data[start + 6 : end]
            if b"\n" in line or b"\r" in line:
                return start
            if line == b"[DONE]":
                self.events += 1
                self._done(out)
                return size
            if line[:1] != b"{":
                return start
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                return start
            self.events += 1
            self._object(obj, out)
            if self._state is not ReaderState.READING:
                return size
            start = end + 2
        return start

    def _done(self, out: list[UpstreamItem]) -> None:
        self._settle_all(out)
        out.append(UpstreamDone())
        self._state = ReaderState.DONE

    def _read(self, event: Event, out: list[UpstreamItem]) -> None:
        self.events += 1
        data = event.data
        if data.strip() == "[DONE]":
            self._done(out)
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            if event.event == "error":
                self._fail(out, data.strip() or "the upstream sent an error event")
            else:
                why = f"the upstream sent data that is not JSON: {bounded_repr(data)}"
                self._fail(out, why, PROTOCOL_ERROR_CODE)
            return
        if not isinstance(obj, dict):
            if event.event == "error":
                self._fail(out, bounded_repr(obj))
            else:
                why = (
                    f"expected a JSON object from the upstream, got {bounded_repr(obj)}"
                )
                self._fail(out, why, PROTOCOL_ERROR_CODE)
            return
        if event.event == "error":
            self._error(obj, out)
            return
        self._object(obj, out)

    def _object(self, obj: dict[str, Any], out: list[UpstreamItem]) -> None:
        """Read one event's JSON object (not of an ``error`` event)."""
        if obj.get("error") is not None:
            self._error(obj, out)
            return
        if obj.get("object") == "error":  # vLLM's error object, not wrapped
            self._error({"error": obj}, out)
            return
        choices = obj.get("choices")
        if type(choices) is list:
            for choice in choices:
                if type(choice) is dict:
                    self._choice(choice, out)
                    if self._state is not ReaderState.READING:
                        return
        usage = obj.get("usage")
        if type(usage) is dict:
            self._read_usage(usage, out)

    def _choice(self, choice: dict[str, Any], out: list[UpstreamItem]) -> None:
        index = choice.get("index", 0)
        if type(index) is not int or index < 0:
            index = 0
        state = self._choices.get(index)
        if state is None:
            state = self._choices[index] = _Choice()
        if state.finished:
            return  # a repeated finish_reason, or text after it
        calls = None
        if self._endpoint is Endpoint.CHAT:
            delta = choice.get("delta")
            text, calls = (
                (delta.get("content"), delta.get("tool_calls"))
                if type(delta) is dict
                else (None, None)
            )
        else:
            text = choice.get("text")
        if type(text) is str and text:
            new = state.feed(text)
            if new:
                out.append(UpstreamDelta(index, new))
        if calls:
            tools = state.tools
            if tools is None:
                tools = state.tools = ToolCallNormalizer(self._new_id)
            out.extend(UpstreamToolCall(index, f) for f in tools.feed(calls))
        reason = choice.get("finish_reason")
        if type(reason) is str and reason:
            if reason in _FAILED_REASONS:
                why = f"the upstream ended choice {index} with finish_reason {reason!r}"
                self._fail(out, why)
                return
            tools = self._settle(index, state, out)
            state.finished = True
            if reason in _LENGTH_REASONS:
                finish = FinishReason.LENGTH
            elif tools is None or not tools.calls:
                finish = FinishReason.STOP
            elif not tools.open_call:
                finish = FinishReason.TOOL_CALLS
            else:  # an unfinished call: cut short, or it ended on its own
                finish = (
                    FinishReason.LENGTH if reason == "tool_calls" else FinishReason.STOP
                )
            out.append(UpstreamFinish(index, finish, reason))

    def _read_usage(self, usage: dict[str, Any], out: list[UpstreamItem]) -> None:
        prompt = usage.get("prompt_tokens", 0)
        completion = usage.get("completion_tokens", 0)
        if type(prompt) is not int or type(completion) is not int:
            return  # a usage we cannot read is no usage
        if prompt < 0 or completion < 0:
            return
        current = self._usage
        if (
            current is None
            or current.prompt_tokens != prompt
            or current.completion_tokens != completion
        ):
            self._usage = Usage(prompt, completion)
            out.append(self._usage)

    def _error(self, obj: dict[str, Any], out: list[UpstreamItem]) -> None:
        error = obj.get("error")
        if isinstance(error, str):  # TGI: {"error": "...", "error_type": "..."}
            kind = obj.get("error_type")
            self._fail(out, error, None, kind if isinstance(kind, str) else None)
            return
        if not isinstance(error, dict):
            error = obj
        message = error.get("message")
        if not isinstance(message, str) or not message:
            message = f"the upstream sent an error: {bounded_repr(error)}"
        kind = error.get("type")
        code = error.get("code")
        self._fail(
            out,
            message,
            None if code is None else str(code),
            kind if isinstance(kind, str) and kind else None,
        )

    def _fail(
        self,
        out: list[UpstreamItem],
        message: str,
        code: str | None = None,
        kind: str | None = None,
    ) -> None:
        self._settle_all(out)
        out.append(UpstreamError(message, kind or "server_error", code))
        self._state = ReaderState.FAILED

    def _settle_all(self, out: list[UpstreamItem]) -> None:
        for index, state in self._choices.items():
            if not state.finished:
                state.finished = True
                self._settle(index, state, out)

    def _settle(
        self, index: int, state: _Choice, out: list[UpstreamItem]
    ) -> ToolCallNormalizer | None:
        """A choice's held text and held tool-call start; its calls, if any."""
        held = state.settle()
        if held:
            out.append(UpstreamDelta(index, held))
        tools = state.tools
        if tools is not None:
            out.extend(UpstreamToolCall(index, f) for f in tools.flush())
        return tools
