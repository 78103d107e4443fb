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
    - A choice's finish reason is ``finish_reason_of``'s
      (``core/upstream_choice.py``): ``TOOL_CALLS`` only for a choice whose
      tool calls are all whole.

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
from typing import Any

import orjson

from sluicegate.core.chunks import Endpoint
from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError, bounded_repr
from sluicegate.core.events import Usage
from sluicegate.core.sse import Event, SSEDecoder
from sluicegate.core.toolcalls import new_call_id
from sluicegate.core.upstream_choice import (
    UpstreamChoice,
    finish_reason_of,
    settle_choice,
)
from sluicegate.core.upstream_items import (
    PROTOCOL_ERROR_CODE,
    ReaderState,
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamFinish,
    UpstreamItem,
    UpstreamToolCall,
    UpstreamTruncated,
)
from sluicegate.core.upstream_tools import ToolCallNormalizer

__all__ = ["UpstreamReader"]

_FAILED_REASONS = frozenset({"abort", "error"})


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
        self._choices: dict[int, UpstreamChoice] = {}
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
            state = self._choices[index] = UpstreamChoice()
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
            tools = settle_choice(index, state, out)
            state.finished = True
            finish = finish_reason_of(reason, tools)
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
                settle_choice(index, state, out)
