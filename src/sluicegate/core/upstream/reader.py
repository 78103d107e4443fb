"""An upstream server's OpenAI event stream in; per-choice text, finishes, usage out.

``UpstreamReader`` reads the body of a streamed ``/chat/completions`` or
``/completions`` response from an OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp's server, Ollama, sluicegate itself), as bytes in any split, and turns
it into a few plain values: ``UpstreamDelta`` (new text of one choice),
``UpstreamReasoning`` (new reasoning text of one choice, from
``delta.reasoning_content`` or ``delta.reasoning``),
``UpstreamToolCall`` (a fragment of one of its tool calls, normalized by
``core/upstream/tools.py``), ``UpstreamFinish``, ``Usage`` (each time it
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

Bounds (``ReaderLimits``, ``core/upstream/limits.py``): a line, an event, the
deltas of one chunk, the tool calls of one choice and the whole body each have
one; past it the stream ends with an ``UpstreamError`` of code
``PROTOCOL_ERROR_CODE``. So does a tool call naming a tool that is not in
``tool_names``. A usage that cannot be true (``usage_problem``) is reported
once as ``UpstreamUsageRejected``, and no usage after it. A choice that
has sent ``usage_bounds.max_completion_tokens`` chunks carrying output (text,
reasoning or tool-call fragments) is cut at the next one that is counted: it
finishes ``LENGTH`` (``UpstreamFinish.cut``) and that chunk and the rest of its
output are dropped. An upstream sends at most one such chunk per token and
part (reasoning, content, each call): vLLM one chunk per engine step, llama.cpp's
server one per part a token changed; so the first chunk of a later part than
any before is not counted (``UpstreamChoice.count_output``).

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
      (``core/upstream/choice.py``): ``TOOL_CALLS`` only for a choice whose
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

import orjson

from sluicegate.core.decoding.toolcalls import new_call_id
from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError, bounded_repr
from sluicegate.core.events import Usage
from sluicegate.core.upstream.chunks import ChunkReader
from sluicegate.core.upstream.fast import MAX_LEARNS, DeltaTemplate, plain_event
from sluicegate.core.upstream.items import (
    PROTOCOL_ERROR_CODE,
    ReaderState,
    UpstreamDone,
    UpstreamError,
    UpstreamItem,
    UpstreamTruncated,
)
from sluicegate.core.upstream.limits import (
    NO_USAGE_BOUNDS,
    READER_LIMITS,
    ReaderLimits,
    UsageBounds,
)
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.core.wire.sse import Event, SSEDecoder

__all__ = ["UpstreamReader"]


class UpstreamReader(ChunkReader):
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

    __slots__ = ("_decoder", "_fast", "_learns", "_template", "events")

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        new_id: Callable[[], str] = new_call_id,
        limits: ReaderLimits = READER_LIMITS,
        tool_names: frozenset[str] | None = None,
        usage_bounds: UsageBounds = NO_USAGE_BOUNDS,
    ) -> None:
        super().__init__(endpoint, new_id, limits, tool_names, usage_bounds)
        self._decoder = SSEDecoder(limits.max_line_bytes, limits.max_event_bytes)
        # Whether the decoder stands between two events, past the stream's
        # first bytes (its BOM) and not after a CR: then ``_feed_plain`` may read
        # plain events itself.
        self._fast = False
        self._template: DeltaTemplate | None = None  # the upstream's plain delta
        self._learns = 0
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
        """Read the plain events at the start of ``data`` (``plain_event``) that
        hold a JSON object or ``[DONE]``; return where the rest begins
        (``len(data)`` once the stream ended).

        The fast twin of ``SSEDecoder.feed`` + ``_read`` for what upstreams
        send almost always: a plain delta (``DeltaTemplate``) costs the parse
        of its text alone. Anything else (a comment, a CR, another field, more
        than one line, invalid UTF-8 or JSON) is left to the decoder, which
        stays between two events meanwhile.
        """
        start = 0
        size = len(data)
        while start < size:
            line, end = plain_event(data, start, self._limits)
            if line == b"[DONE]":
                self.events += 1
                self._done(out)
                return size
            if line[:1] != b"{":
                return start
            template = self._template
            read = None if template is None else template.read(line)
            if read is not None:
                self.events += 1
                if read[1] is not None:  # before the text, as in _object
                    self._read_usage(read[1], out)
                self._plain_delta(read[0], out)
                if self._state is not ReaderState.READING:
                    return size  # a cut that refused a held tool call
                start = end
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                return start
            self.events += 1
            if self._learns < MAX_LEARNS and type(obj) is dict:
                learned = DeltaTemplate.learn(line, obj, self._endpoint)
                if learned is not None:
                    self._template = learned
                    self._learns += 1
            self._object(obj, out)
            if self._state is not ReaderState.READING:
                return size
            start = end
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
