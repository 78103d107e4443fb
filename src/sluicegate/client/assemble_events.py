"""Read a Responses or Messages event stream into a ``StreamResult``.

The sans-IO twin of ``client.assemble.StreamAssembler`` for the two typed-event
APIs: bytes in, ``TextDelta`` values out, and at the end the same
``StreamResult`` and end state (``core.endstate.classify``) the chat client
gives. The terminal event plays the part of ``[DONE]``: ``response.completed``
/ ``response.incomplete`` (Responses) or ``message_stop`` (Messages); an
``error`` event or ``response.failed`` makes the stream ``errored``. Reasoning
(``response.reasoning_text.delta``; Messages ``thinking_delta``) is assembled
into ``ChoiceResult.reasoning`` and yielded as ``TextDelta.reasoning`` (never
in ``text``); the Responses usage's ``output_tokens_details.reasoning_tokens``
is kept.

Spec: OpenAI API reference, "Responses: streaming events"; Anthropic API,
"Streaming Messages".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import orjson

from sluicegate.client.results import (
    ChoiceResult,
    StreamResult,
    TextDelta,
    TimeoutKind,
    Timing,
)
from sluicegate.core.endstate import classify
from sluicegate.core.errors import RemoteProtocolError
from sluicegate.core.events import Usage
from sluicegate.core.wire.sse import SSEDecoder

__all__ = ["EventApi", "EventStreamAssembler"]

EventApi = Literal["responses", "messages"]
"""Which API's events a stream carries."""
_DONE = {
    "responses": frozenset({"response.completed", "response.incomplete"}),
    "messages": frozenset({"message_stop"}),
}


class EventStreamAssembler:
    """Assemble one streamed Responses or Messages answer.

    Call ``head`` once, ``feed`` with body bytes as they come, then ``flush``.
    The result has one choice (index 0): its ``finish_reason`` is the API's own
    value (Messages ``stop_reason``; Responses ``"stop"`` when completed, else
    ``incomplete_details.reason``). Usage maps input/output tokens to
    ``prompt_tokens``/``completion_tokens``. Times are seconds since the request.
    """

    resumes = 0
    """Typed-event streams are not resumable: always 0."""
    unended_id: str | None = None
    """No event ids to resume from: always ``None``."""

    def __init__(self, api: EventApi, *, record: bool = False) -> None:
        self._api = api
        self._record = record
        self._raw: list[bytes] = []
        self._decoder = SSEDecoder()
        self._status: int | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._reasoning_tokens: int | None = None
        self._finish: str | None = None
        self._usage: dict[str, int] = {}
        self._error: Mapping[str, Any] | None = None
        self._done = False
        self._events = 0
        self._protocol_error: str | None = None
        self._head_s: float | None = None
        self._first_token_s: float | None = None

    def head(self, status: int, headers: Mapping[str, str], now_s: float) -> None:
        """Record the response head (status, lowercased header names)."""
        self._status, self._head_s = status, now_s
        self._headers = {k.lower(): v for k, v in headers.items()}

    def feed(self, data: bytes, now_s: float) -> list[TextDelta]:
        """Take body bytes; the text deltas they complete (empty when rejected).

        A malformed stream (bad UTF-8, an event whose data is not a JSON object
        of its ``type``) stops the reading: later bytes are ignored.
        """
        if self._record:
            self._raw.append(data)
        if self._status != 200 or self._protocol_error:
            self._body.append(data)
            return []
        try:
            events = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            self._protocol_error = str(exc)
            return []
        out = []
        for event in events:
            delta = self._take(event.event, event.data)
            if delta is not None:
                self._first_token_s = self._first_token_s or now_s
                out.append(delta)
        return out

    def _take(self, name: str, data: str) -> TextDelta | None:
        self._events += 1
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or obj.get("type") != name:
            self._protocol_error = f"event {name!r} with data {data[:80]!r}"
            return None
        if name == "error":
            error = obj.get("error")
            self._error = error if isinstance(error, dict) else {"message": data}
        self._done = self._done or name in _DONE[self._api]
        take = _responses if self._api == "responses" else _messages
        return take(self, name, obj)

    @property
    def stopped(self) -> bool:
        """Whether reading should stop (a malformed stream, unless recording)."""
        return self._protocol_error is not None and not self._record

    def resume(self) -> str | None:
        """No resume point: always ``None`` (the interface of ``StreamAssembler``)."""
        return None

    def flush(
        self,
        now_s: float,
        *,
        client_gone: bool = False,
        timeout: TimeoutKind | None = None,
        transport_error: str | None = None,
    ) -> StreamResult:
        """End the stream and classify it, as ``StreamAssembler.flush``.

        Args:
            now_s: when reading ended, seconds since the request.
            client_gone: the caller stopped reading before the end.
            timeout: the limit that fired, if one did (implies ``client_gone``).
            transport_error: the connection failure, if one ended the reading.
        """
        if self._status is not None and self._status != 200:
            self._error = _rejection(b"".join(self._body))
        if self._protocol_error and self._error is None:
            self._done = False
        state = classify(
            self._status, int(self._finish is not None), 1, self._done, self._error,
            client_gone=client_gone or timeout is not None,
        )  # fmt: skip
        usage = None
        if {"input", "output"} <= self._usage.keys():
            usage = Usage(
                self._usage["input"],
                self._usage["output"],
                reasoning_tokens=self._reasoning_tokens,
            )
        choice = ChoiceResult(
            0, "".join(self._text), self._finish, reasoning="".join(self._reasoning)
        )
        return StreamResult(
            end_state=state, status=self._status,
            choices=(choice,),
            usage=usage, error=self._error, events=self._events,
            saw_done=self._done, headers=dict(self._headers),
            timing=Timing(self._head_s, None, self._first_token_s, now_s),
            protocol_error=self._protocol_error, transport_error=transport_error,
            timeout=timeout, raw=b"".join(self._raw),
        )  # fmt: skip

    def _count(self, usage: Any, key: str, name: str) -> None:
        if isinstance(usage, dict) and isinstance(usage.get(key), int):
            self._usage[name] = usage[key]


def _responses(
    a: EventStreamAssembler, name: str, obj: Mapping[str, Any]
) -> TextDelta | None:
    delta = obj.get("delta")
    if name == "response.output_text.delta" and isinstance(delta, str):
        a._text.append(delta)
        return TextDelta(0, delta) if delta else None
    if name == "response.reasoning_text.delta" and isinstance(delta, str):
        a._reasoning.append(delta)
        return TextDelta(0, "", delta) if delta else None
    resp = obj.get("response")
    if name in ("response.completed", "response.incomplete", "response.failed"):
        resp = resp if isinstance(resp, dict) else {}
        a._count(resp.get("usage"), "input_tokens", "input")
        a._count(resp.get("usage"), "output_tokens", "output")
        usage = resp.get("usage")
        details = (
            usage.get("output_tokens_details") if isinstance(usage, dict) else None
        )
        if isinstance(details, dict) and type(details.get("reasoning_tokens")) is int:
            a._reasoning_tokens = details["reasoning_tokens"]
        details = resp.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        a._finish = "stop" if name == "response.completed" else reason
        if name == "response.failed":
            error = resp.get("error")
            a._error = error if isinstance(error, dict) else {"message": name}
    return None


def _messages(
    a: EventStreamAssembler, name: str, obj: Mapping[str, Any]
) -> TextDelta | None:
    delta = obj.get("delta")
    if name == "content_block_delta" and isinstance(delta, dict):
        text = delta.get("text")
        if delta.get("type") == "text_delta" and isinstance(text, str) and text:
            a._text.append(text)
            return TextDelta(0, text)
        thought = delta.get("thinking")
        if delta.get("type") == "thinking_delta" and isinstance(thought, str):
            a._reasoning.append(thought)
            return TextDelta(0, "", thought) if thought else None
    elif name == "message_start" and isinstance(obj.get("message"), dict):
        a._count(obj["message"].get("usage"), "input_tokens", "input")
    elif name == "message_delta":
        a._count(obj.get("usage"), "output_tokens", "output")
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
            a._finish = delta["stop_reason"]
    return None


def _rejection(body: bytes) -> Mapping[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict):
        return error
    return {"message": body.decode("utf-8", "replace")}
