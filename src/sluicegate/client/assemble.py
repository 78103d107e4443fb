"""Response bytes in, text deltas out, and one ``StreamResult`` at the end (sans-IO).

``StreamAssembler`` is the whole client-side decision: the HTTP shells
(``sluicegate.client.sync`` and ``.aio``) only read bytes, pass them to ``feed``
with the time they arrived, and call ``flush`` once with how the reading ended.

Invariants:

- SSE is decoded by ``core.sse.SSEDecoder`` (strict UTF-8, CR/LF/CRLF, comments),
  so any split of the body gives the same deltas and the same result.
- The end state comes from ``core.endstate.classify``, the rule the server's
  ledger uses too.
- A malformed stream (bad UTF-8, an event that is neither JSON nor ``[DONE]``, a
  chunk without a ``choices`` list) stops the assembly: ``stopped`` turns true,
  ``protocol_error`` says why, and the stream counts as truncated (it never
  delivered its end).
- Bytes after ``[DONE]`` are ignored.
- A stream whose events carry ``id:`` lines (a resumable one) and that stopped
  before its end may go on in another response: ``resume()`` names the last id
  seen and drops any event the cut left half-read; the next response's body is
  fed as the rest of this one.

A chat delta's reasoning (``reasoning_content``, else ``reasoning``) is
assembled apart from the text, into ``ChoiceResult.reasoning``, and yielded as
``TextDelta.reasoning`` (never in ``text``).

Tool calls are exposed (``ChoiceResult.tool_calls``) only when their arguments
are whole JSON; the rest (cut by ``max_tokens``, say) are kept apart, in
``incomplete_tool_calls``. A ``tool_calls`` entry without an integer ``index``
(Ollama's and Gemini's OpenAI endpoints, some proxies) is not dropped: one with
an ``id`` not seen in this choice begins the next call (one past the highest
index so far), anything else continues the latest call (index 0 when there is
none), as the gateway reads such an upstream (``core/upstream/tools.py``) and
the Vercel AI SDK's OpenAI-compatible provider reads such a server.

Deliberate divergences from the openai client: a ``finish_reason`` counts as a
finish whatever its value, even ``""`` (``sluicegate check`` grades the value); an
``error`` object in a chunk ends the stream as ``errored`` even if the server then
sends ``[DONE]``.

Spec: OpenAI API reference, "The chat completion chunk object" and "Streaming";
WHATWG HTML, "9.2.6 Interpreting an event stream"; docs/DESIGN.md,
"The wire" and "End states".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from sluicegate.client.assemble_choice import ChoiceParts
from sluicegate.client.results import (
    StreamResult,
    TextDelta,
    TimeoutKind,
    Timing,
)
from sluicegate.core.endstate import EndState, classify
from sluicegate.core.errors import RemoteProtocolError
from sluicegate.core.events import Usage
from sluicegate.core.wire.sse import SSEDecoder

__all__ = ["MAX_ERROR_BODY_BYTES", "StreamAssembler"]

MAX_ERROR_BODY_BYTES = 65536
"""Bytes of a non-200 body kept for its error message; the rest is dropped."""


class StreamAssembler:
    """Assemble one streamed chat or completion response.

    Call ``head`` when the status and headers arrive, ``feed`` with each piece of
    the body, and ``flush`` once at the end. A non-200 body is kept (up to
    ``MAX_ERROR_BODY_BYTES``) and parsed as an OpenAI error at ``flush``.

    Args:
        n: choices requested (>= 1); a stream is finished only when this many
            choices have a ``finish_reason``.
        record: keep every body byte in ``StreamResult.raw``.

    Attributes:
        stopped: reading more is pointless: a protocol error, or (when not
            recording) ``[DONE]`` or an in-band error came.
    """

    def __init__(self, n: int = 1, *, record: bool = False) -> None:
        if n < 1:
            raise ValueError(f"expected n >= 1, got {n!r}")
        self._n = n
        self._record = record
        self._raw: list[bytes] = []
        self._decoder = SSEDecoder()
        self._choices: dict[int, ChoiceParts] = {}
        self._status: int | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._usage: Usage | None = None
        self._error: Mapping[str, Any] | None = None
        self._protocol_error: str | None = None
        self._saw_done = False
        self._events = 0
        self._head_s: float | None = None
        self._first_event_s: float | None = None
        self._first_token_s: float | None = None
        self._last_activity_s: float | None = None
        self._gaps: list[float] = []
        self._token_times: list[float] = []
        self._flushed = False
        self._last_id: str | None = None
        self._comments = 0  # of the decoders before the current one
        self.resumes = 0
        """Times ``resume()`` let the stream go on in another response."""

    @property
    def stopped(self) -> bool:
        """Whether the shell should stop reading (see the class docstring)."""
        if self._protocol_error is not None:
            return True
        return not self._record and (self._saw_done or self._error is not None)

    def _halted(self) -> bool:
        return self._saw_done or self._protocol_error is not None

    def head(self, status: int, headers: Mapping[str, str], now_s: float) -> None:
        """The response head arrived at ``now_s`` (seconds since the request)."""
        self._status = status
        self._headers = {k.lower(): v for k, v in headers.items()}
        self._head_s = self._last_activity_s = now_s

    def feed(self, data: bytes, now_s: float) -> list[TextDelta]:
        """Take the next body bytes, which arrived at ``now_s``.

        Args:
            data: any number of bytes, split anywhere.
            now_s: arrival time in seconds since the request was sent.

        Returns:
            The non-empty text deltas these bytes completed, in wire order.
            ``[]`` for a non-200 body, after ``[DONE]`` or after a protocol error.
        """
        if not data:
            return []
        if self._last_activity_s is not None:
            self._gaps.append(now_s - self._last_activity_s)
        self._last_activity_s = now_s
        if self._record:
            self._raw.append(data)
        if self._status != 200:
            if self._body_len < MAX_ERROR_BODY_BYTES:
                self._body.append(data)
                self._body_len += len(data)
            return []
        if self._halted():
            return []
        try:
            events = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            self._protocol_error = str(exc)
            return []
        deltas: list[TextDelta] = []
        for event in events:
            if self._halted():
                break
            self._last_id = event.id
            deltas.extend(self._take(event.data, now_s))
        return deltas

    @property
    def last_event_id(self) -> str | None:
        """The ``id`` of the last event taken, or ``None`` (no ``id:`` seen)."""
        return self._last_id

    @property
    def unended_id(self) -> str | None:
        """The last event id of a 200 stream that has not ended (no ``[DONE]``,
        no error event, no protocol error): what a resume or a cancel names;
        ``None`` otherwise (or when its events carry no ids)."""
        if (
            self._status != 200
            or self._last_id is None
            or self._halted()
            or self._error is not None
        ):
            return None
        return self._last_id

    def resume(self) -> str | None:
        """The cursor to resume an unended stream from, or ``None`` when it cannot.

        A stream can go on when its status was 200, its events carry ids, and it
        has not ended (no ``[DONE]``, no error event, no protocol error). Then the
        half-read event the cut left (if any) is dropped, and the next bytes fed
        are the resumed response's body.

        Returns:
            The last event id seen (send it as ``Last-Event-ID``), or ``None``.

        Spec: WHATWG HTML, "9.2.3 Processing model" (reconnection with
        ``Last-Event-ID``).
        """
        if self.unended_id is None:
            return None
        self._comments += self._decoder.comments
        self._decoder = SSEDecoder()
        self.resumes += 1
        return self._last_id

    def flush(
        self,
        now_s: float,
        *,
        client_gone: bool = False,
        timeout: TimeoutKind | None = None,
        transport_error: str | None = None,
    ) -> StreamResult:
        """End the stream and classify it; the assembler is done after this.

        Args:
            now_s: when reading ended, in seconds since the request.
            client_gone: the caller stopped reading before the end (closed the
                stream, or a timeout fired): an unfinished stream is then
                ``aborted``, not ``truncated``.
            timeout: the limit that fired, if one did (implies ``client_gone``).
            transport_error: the connection failure, if one ended the reading.

        Returns:
            The one result of this stream.

        Raises:
            RuntimeError: called twice.
        """
        if self._flushed:
            raise RuntimeError("StreamAssembler.flush() called twice")
        self._flushed = True
        if self._status is not None and self._status != 200:
            self._error = _rejection_error(b"".join(self._body))
        state = classify(
            self._status,
            sum(c.finish_reason is not None for c in self._choices.values()),
            self._n,
            self._saw_done,
            self._error,
            client_gone=client_gone or timeout is not None,
        )
        return self._result(state, now_s, timeout, transport_error)

    def _result(
        self,
        state: EndState,
        now_s: float,
        timeout: TimeoutKind | None,
        transport_error: str | None,
    ) -> StreamResult:
        indexes = sorted(set(self._choices) | set(range(self._n)))
        empty = ChoiceParts()
        return StreamResult(
            end_state=state,
            status=self._status,
            choices=tuple(self._choices.get(i, empty).freeze(i) for i in indexes),
            usage=self._usage,
            error=self._error,
            events=self._events,
            comments=self._comments + self._decoder.comments,
            saw_done=self._saw_done,
            timing=Timing(
                self._head_s,
                self._first_event_s,
                self._first_token_s,
                now_s,
                tuple(self._gaps),
                tuple(self._token_times),
            ),
            headers=dict(self._headers),
            protocol_error=self._protocol_error,
            transport_error=transport_error,
            timeout=timeout,
            resumes=self.resumes,
            raw=b"".join(self._raw),
        )

    def _take(self, data: str, now_s: float) -> list[TextDelta]:
        self._events += 1
        if self._first_event_s is None:
            self._first_event_s = now_s
        if data == "[DONE]":
            self._saw_done = True
            return []
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._protocol_error = f"an event is neither JSON nor [DONE]: {data!r}"
            return []
        if not isinstance(chunk, dict):
            self._protocol_error = f"an event is not a JSON object: {data!r}"
            return []
        if chunk.get("error") is not None:
            error = chunk["error"]
            self._error = error if isinstance(error, dict) else {"message": error}
            return []
        if isinstance(usage := chunk.get("usage"), dict):
            details = usage.get("completion_tokens_details")
            reasoning = (
                details.get("reasoning_tokens") if isinstance(details, dict) else None
            )
            self._usage = Usage(
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
                reasoning_tokens=reasoning if type(reasoning) is int else None,
            )
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not all(
            isinstance(c, dict) and isinstance(c.get("index"), int) for c in choices
        ):
            self._protocol_error = f"a chunk without a valid choices list: {data!r}"
            return []
        deltas = [d for c in choices if (d := self._take_choice(c)) is not None]
        if deltas:
            self._token_times.append(now_s)
            if self._first_token_s is None:
                self._first_token_s = now_s
        return deltas

    def _take_choice(self, wire: dict[str, Any]) -> TextDelta | None:
        choice = self._choices.setdefault(wire["index"], ChoiceParts())
        return choice.take(wire)


def _rejection_error(body: bytes) -> Mapping[str, Any]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error: Mapping[str, Any] = parsed["error"]
        return error
    return {"message": body.decode("utf-8", errors="replace")}
