"""An upstream server's OpenAI event stream in; per-choice text, finishes, usage out.

``UpstreamReader`` reads the body of a streamed ``/chat/completions`` or
``/completions`` response from an OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp's server, Ollama, sluicegate itself), as bytes in any split, and turns
it into a few plain values: ``UpstreamDelta`` (new text of one choice),
``UpstreamReasoning`` (new reasoning text of one choice, from
``delta.reasoning_content`` or ``delta.reasoning``),
``UpstreamToolCall`` (a fragment of one of its tool calls, normalized by
``core/upstream_tools.py``), ``UpstreamFinish``, ``Usage`` (each time it
changes), ``UpstreamError`` (an
in-band error, or a stream that breaks the protocol), ``UpstreamDone`` (the first
``[DONE]``) and, from ``flush()``, ``UpstreamTruncated`` (the body ended without
``[DONE]``). What the gateway sends its own client is built from these values
by its own core, so none of an upstream's quirks travel on.

Quirks absorbed (each one seen in a real server or its issue tracker):

- usage on every chunk (continuous usage) or only on a last chunk with
  ``choices: []``: a ``Usage`` item only when the counts change, before the
  items of the chunk's deltas (the usage of a chunk counts them already, so the
  prompt's tokens are known from the first content on); its
  ``prompt_tokens_details.cached_tokens`` (vLLM, SGLang, llama-server) as
  ``Usage.cached_tokens``;
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

Bounds (``ReaderLimits``, ``core/reader_limits.py``): a line, an event, the
deltas of one chunk, the tool calls of one choice and the whole body each have
one; past it the stream ends with an ``UpstreamError`` of code
``PROTOCOL_ERROR_CODE``. So does a tool call naming a tool that is not in
``tool_names``. A usage that cannot be true (``usage_problem``) is reported
once as ``UpstreamUsageRejected``, and no usage after it.

Invariants:
    - ``feed`` and ``flush`` raise nothing but ``LocalProtocolError`` (a call
      after ``flush()``), whatever the bytes (property-tested); between two
      calls the reader holds at most one line, one event's data, one name per
      tool call (``MAX_TOOL_NAME_CHARS``) and ``max_tool_calls`` calls per
      choice; the work of one call is linear in its bytes.
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
      tool calls are all whole. Its ``matched_stop`` is the choice's
      ``stop_reason`` (vLLM) or ``matched_stop`` (SGLang) when that is a
      string: the stop string the upstream stopped on (the engine keeps it
      only when the request sent that string).

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
from sluicegate.core.logprobs import LogprobToken
from sluicegate.core.reader_limits import (
    NO_USAGE_BOUNDS,
    READER_LIMITS,
    ReaderLimits,
    UsageBounds,
    cached_tokens,
    reported_reasoning_tokens,
    usage_problem,
)
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
    UpstreamReasoning,
    UpstreamToolCall,
    UpstreamTruncated,
    UpstreamUsageRejected,
)
from sluicegate.core.upstream_logprobs import read_logprobs
from sluicegate.core.upstream_tools import ToolCallNormalizer

__all__ = ["UpstreamReader"]

_FAILED_REASONS = frozenset({"abort", "error"})


MAX_MATCHED_STOP_CHARS = 4096
"""The longest stop string an upstream's ``stop_reason`` is taken for."""


def _matched_stop(choice: dict[str, Any]) -> str | None:
    """The stop string a finished choice names: vLLM's ``stop_reason`` or
    SGLang's ``matched_stop`` when it is a string (a token id, ``null`` for an
    end of sequence, or one too long is none)."""
    for name in ("stop_reason", "matched_stop"):
        value = choice.get(name)
        if type(value) is str and 0 < len(value) <= MAX_MATCHED_STOP_CHARS:
            return value
    return None


class UpstreamReader:
    """Bytes of an upstream's streamed response in (any split), items out.

    Args:
        endpoint: which API the stream answers: ``Endpoint.CHAT`` reads
            ``choices[].delta.content`` and ``choices[].delta.tool_calls``,
            ``Endpoint.COMPLETION`` ``choices[].text``.
        new_id: makes the id of a tool call the upstream sent none for.
        limits: the bounds of the stream (``ReaderLimits``' defaults).
        tool_names: the tools a call may name (those the client offered);
            ``None``: any.
        usage_bounds: what the request's usage can be at most.

    Attributes:
        events: data events read so far (``[DONE]`` included).
        bytes: bytes of the body read so far.
        usage_rejected: why the upstream's usage was rejected, or ``None``.

    After ``flush()`` further calls raise ``LocalProtocolError``.
    """

    __slots__ = (
        "_choices",
        "_chunk_deltas",
        "_decoder",
        "_endpoint",
        "_fast",
        "_limits",
        "_new_id",
        "_state",
        "_tool_names",
        "_usage",
        "_usage_bounds",
        "bytes",
        "events",
        "usage_rejected",
    )

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        new_id: Callable[[], str] = new_call_id,
        limits: ReaderLimits = READER_LIMITS,
        tool_names: frozenset[str] | None = None,
        usage_bounds: UsageBounds = NO_USAGE_BOUNDS,
    ) -> None:
        self._endpoint = endpoint
        self._new_id = new_id
        self._limits = limits
        self._tool_names = tool_names
        self._usage_bounds = usage_bounds
        self._decoder = SSEDecoder(limits.max_line_bytes, limits.max_event_bytes)
        # Whether the decoder stands between two events, past the stream's
        # first bytes (its BOM) and not after a CR: then ``_feed_plain`` may read
        # plain events itself.
        self._fast = False
        self._state = ReaderState.READING
        self._choices: dict[int, UpstreamChoice] = {}
        self._usage: Usage | None = None
        self._chunk_deltas = 0  # choices and tool-call entries of this chunk
        self.events = 0
        self.bytes = 0
        self.usage_rejected: str | None = None

    @property
    def state(self) -> ReaderState:
        """Where the reader is."""
        return self._state

    @property
    def usage(self) -> Usage | None:
        """The latest usage the upstream reported, or ``None``."""
        return self._usage

    @property
    def held_bytes(self) -> int:
        """Bytes of the body held between two ``feed`` calls (``SSEDecoder``'s:
        at most ``max_line_bytes`` plus ``max_event_bytes``)."""
        return self._decoder.held_bytes

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
        self.bytes += len(data)
        if self.bytes > self._limits.max_response_bytes:
            why = f"a body longer than {self._limits.max_response_bytes} bytes"
            self._fail(out, f"the upstream sent {why}", PROTOCOL_ERROR_CODE)
            return out
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
        refused = self._settle_all(out)
        if refused is not None:
            out.append(UpstreamError(refused, "server_error", PROTOCOL_ERROR_CODE))
            return out
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
        max_line = self._limits.max_line_bytes
        while start < size:
            end = data.find(b"\n\n", start)
            if end < 0 or not data.startswith(b"data: ", start):
                return start
            if end - start > max_line or end - start - 6 > self._limits.max_event_bytes:
                return start  # the decoder says which bound it passes
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
        refused = self._settle_all(out)
        if refused is not None:
            self._fail(out, refused, PROTOCOL_ERROR_CODE)
            return
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
        usage = obj.get("usage")
        if type(usage) is dict:  # before the deltas: they count in it already
            self._read_usage(usage, out)
        choices = obj.get("choices")
        if type(choices) is list:
            self._chunk_deltas = 0
            for choice in choices:
                if type(choice) is dict:
                    self._choice(choice, out)
                    if self._state is not ReaderState.READING:
                        return

    def _choice(self, choice: dict[str, Any], out: list[UpstreamItem]) -> None:
        self._chunk_deltas += 1
        if self._chunk_deltas > self._limits.max_deltas_per_chunk:
            self._too_many_deltas(out)
            return
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
            if type(delta) is dict:
                self._reasoning(index, delta, out)
        else:
            text = choice.get("text")
        if type(text) is str and text:
            new = state.feed(text)
            if new:
                out.append(UpstreamDelta(index, new, self._logprobs(choice, new, text)))
        if calls:
            if type(calls) is list:
                self._chunk_deltas += len(calls)
                if self._chunk_deltas > self._limits.max_deltas_per_chunk:
                    self._too_many_deltas(out)
                    return
            tools = state.tools
            if tools is None:
                tools = state.tools = ToolCallNormalizer(
                    self._new_id,
                    tool_names=self._tool_names,
                    max_calls=self._limits.max_tool_calls,
                )
            try:
                fragments = tools.feed(calls)
            except RemoteProtocolError as exc:
                self._fail(out, str(exc), PROTOCOL_ERROR_CODE)
                return
            out.extend(UpstreamToolCall(index, f) for f in fragments)
        reason = choice.get("finish_reason")
        if type(reason) is str and reason:
            if reason in _FAILED_REASONS:
                why = f"the upstream ended choice {index} with finish_reason {reason!r}"
                self._fail(out, why)
                return
            state.finished = True
            try:
                tools = settle_choice(index, state, out)
            except RemoteProtocolError as exc:
                self._fail(out, str(exc), PROTOCOL_ERROR_CODE)
                return
            finish = finish_reason_of(reason, tools)
            out.append(UpstreamFinish(index, finish, reason, _matched_stop(choice)))

    def _logprobs(
        self, choice: dict[str, Any], new: str, text: str
    ) -> tuple[LogprobToken, ...] | None:
        """The chunk's token logprobs, when they are exactly ``new``'s tokens (a
        cumulative chunk's, or tokens that split a character, are not)."""
        raw = choice.get("logprobs")
        if raw is None or new != text:
            return None
        chat = self._endpoint is Endpoint.CHAT
        tokens = read_logprobs(raw, chat, self._limits.max_deltas_per_chunk)
        if tokens is None or "".join(t.token for t in tokens) != new:
            return None
        return tokens

    def _reasoning(
        self, index: int, delta: dict[str, Any], out: list[UpstreamItem]
    ) -> None:
        """A delta's reasoning, before its content: ``reasoning_content``
        (vLLM, SGLang, llama.cpp's server), else ``reasoning`` (newer vLLM,
        which for a while sent both with the same text: taken once)."""
        reasoning = delta.get("reasoning_content")
        if type(reasoning) is not str or not reasoning:
            reasoning = delta.get("reasoning")
        if type(reasoning) is str and reasoning:
            out.append(UpstreamReasoning(index, reasoning))

    def _too_many_deltas(self, out: list[UpstreamItem]) -> None:
        limit = self._limits.max_deltas_per_chunk
        why = f"the upstream sent a chunk of more than {limit} deltas"
        self._fail(out, why, PROTOCOL_ERROR_CODE)

    def _read_usage(self, usage: dict[str, Any], out: list[UpstreamItem]) -> None:
        if self.usage_rejected is not None:
            return  # once wrong, never trusted again
        why, prompt, completion = usage_problem(usage, self._usage_bounds, self.bytes)
        if why is not None:
            self.usage_rejected = why
            self._usage = None
            out.append(UpstreamUsageRejected(why))
            return
        reasoning = reported_reasoning_tokens(usage, completion)
        read = Usage(prompt, completion, cached_tokens(usage, prompt), reasoning)
        if read != self._usage:
            self._usage = read
            out.append(read)

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
        self._settle_all(out)  # a call refused here is dropped: the stream failed
        out.append(UpstreamError(message, kind or "server_error", code))
        self._state = ReaderState.FAILED

    def _settle_all(self, out: list[UpstreamItem]) -> str | None:
        """End every open choice; the first refusal of a held tool call (its
        message), if any (the other choices still end)."""
        refused = None
        for index, state in self._choices.items():
            if not state.finished:
                state.finished = True
                try:
                    settle_choice(index, state, out)
                except RemoteProtocolError as exc:
                    refused = refused or str(exc)
        return refused
