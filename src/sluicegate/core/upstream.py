"""An upstream server's OpenAI event stream in; per-choice text, finishes, usage out.

``UpstreamReader`` reads the body of a streamed ``/chat/completions`` or
``/completions`` response from an OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp's server, Ollama, sluicegate itself), as bytes in any split, and turns
it into a few plain values: ``UpstreamDelta`` (new text of one choice),
``UpstreamFinish``, ``Usage`` (each time it changes), ``UpstreamError`` (an
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
      non-empty, and come before its one ``UpstreamFinish``.

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
  ``FinishReason.STOP`` (``UpstreamFinish.raw`` keeps the upstream's word),
  except ``abort`` and ``error``, which are an ``UpstreamError``.
- Data that is not JSON, or JSON that is not an object, is an
  ``UpstreamError`` (code ``upstream_protocol_error``), not an exception: for
  the gateway it ends the stream like any other upstream failure.

Spec: OpenAI API reference, "The chat completion chunk object", "Create
completion" (streaming) and "Error codes"; WHATWG HTML, "9.2.6 Interpreting an
event stream" (through ``SSEDecoder``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from sluicegate.core.chunks import Endpoint
from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError, bounded_repr
from sluicegate.core.events import FinishReason, Usage
from sluicegate.core.sse import Event, SSEDecoder

__all__ = [
    "PROTOCOL_ERROR_CODE",
    "ReaderState",
    "UpstreamDelta",
    "UpstreamDone",
    "UpstreamError",
    "UpstreamFinish",
    "UpstreamItem",
    "UpstreamReader",
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

    __slots__ = ("finished", "first", "held", "mode", "seen")

    def __init__(self) -> None:
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
            ``choices[].delta.content``, ``Endpoint.COMPLETION``
            ``choices[].text``.

    Attributes:
        events: data events read so far (``[DONE]`` included).

    After ``flush()`` further calls raise ``LocalProtocolError``.
    """

    __slots__ = ("_choices", "_decoder", "_endpoint", "_state", "_usage", "events")

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._decoder = SSEDecoder()
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
        try:
            events = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            out: list[UpstreamItem] = []
            self._fail(out, str(exc), PROTOCOL_ERROR_CODE)
            return out
        if not events:
            return []
        out = []
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

    def _read(self, event: Event, out: list[UpstreamItem]) -> None:
        self.events += 1
        data = event.data
        if data.strip() == "[DONE]":
            self._settle_all(out)
            out.append(UpstreamDone())
            self._state = ReaderState.DONE
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
        if event.event == "error" or obj.get("error") is not None:
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
        if self._endpoint is Endpoint.CHAT:
            delta = choice.get("delta")
            text = delta.get("content") if type(delta) is dict else None
        else:
            text = choice.get("text")
        if type(text) is str and text:
            new = state.feed(text)
            if new:
                out.append(UpstreamDelta(index, new))
        reason = choice.get("finish_reason")
        if type(reason) is str and reason:
            if reason in _FAILED_REASONS:
                why = f"the upstream ended choice {index} with finish_reason {reason!r}"
                self._fail(out, why)
                return
            held = state.settle()
            if held:
                out.append(UpstreamDelta(index, held))
            state.finished = True
            finish = (
                FinishReason.LENGTH if reason in _LENGTH_REASONS else FinishReason.STOP
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
                held = state.settle()
                if held:
                    out.append(UpstreamDelta(index, held))
