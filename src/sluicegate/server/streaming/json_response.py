"""The ASGI app that waits for one whole generation and sends it as one JSON body.

``CompletionResponse`` collects the generation's deltas from its buffer while
``DisconnectRace`` watches for the client leaving, then sends a
``chat.completion`` or ``text_completion`` object, or the OpenAI error shape
with the status ``answers.status_of`` gives the ``Fail`` that ended it.

Invariants:
    - Nothing is sent before the generation ended; a client that left before
      gets nothing, its engine sequences are aborted, and the ledger status is
      ``CLIENT_CLOSED``.
    - The body has a ``Content-Length``; the status is 200 only for a finished
      generation.

Spec: OpenAI API reference, "The chat completion object", "The completion
object" and "Error codes"; docs/DESIGN.md, "Status first, errors in band".
"""

from __future__ import annotations

import sys
from typing import Any

from starlette.types import Receive, Scope, Send

from sluicegate.core.endstate import EndState, classify_body
from sluicegate.core.events import Delta, DeltaParts, End, Fail, join_all_parts
from sluicegate.core.logprobs import LogprobToken
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    dumps,
)
from sluicegate.core.wire.completions import chat_completion, text_completion
from sluicegate.core.wire.contracts import Whole, error_body, whole_body
from sluicegate.server.http.answers import status_of
from sluicegate.server.http.errors import CLIENT_CLOSED, InternalError
from sluicegate.server.streaming.buffer import LiveStreams, StreamBuffer
from sluicegate.server.streaming.disconnect import DisconnectRace
from sluicegate.server.streaming.generation import Generation
from sluicegate.server.streaming.shared import OnEnd, StreamLimits, attached

__all__ = ["CompletionResponse"]


class CompletionResponse:
    """An ASGI app that waits for the whole generation and sends one JSON body.

    The client's disconnect is watched while waiting: it aborts the engine,
    nothing is sent, and ``on_end`` gets ``CLIENT_CLOSED``. An engine failure
    (nothing sent yet) is answered with ``status_of`` its ``Fail`` (503 for
    ``EngineUnavailable`` and the shutdown, 504 for a timeout, else 500), in
    the OpenAI error shape.

    Args:
        generation: already ``start()``-ed.
        header: id, created, model and endpoint of the response.
        on_end: told the end state (finished, errored or aborted) and the status.
        limits: the deadlines (the other limits do not apply to one body).
        live: where the response's buffer is registered while it runs.

    Spec: OpenAI API reference, "The chat completion object", "The completion
    object".
    """

    def __init__(
        self,
        generation: Generation,
        header: ResponseHeader,
        on_end: OnEnd,
        limits: StreamLimits | None = None,
        live: LiveStreams | None = None,
    ) -> None:
        self._generation = generation
        self._header = header
        self._on_end = on_end
        self._limits = limits or StreamLimits()
        self._live = live if live is not None else LiveStreams()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Generate, then send ``chat.completion``/``text_completion`` JSON."""
        # Until set below: a bug escaped, and Starlette answers 500.
        state, status = EndState.ERRORED, status_of(InternalError())
        gone = failed = written = False
        try:
            with DisconnectRace(receive) as race:
                collected, fail = await self._collect()
            gone = race.reason is not None
            if gone:
                status = CLIENT_CLOSED
                return
            failed = fail is not None
            if fail is None:
                status, body = 200, self._payload(collected)
            else:
                status = status_of(fail)
                body = error_body(
                    self._header.endpoint,
                    status,
                    fail.message,
                    fail.type,
                    None,
                    fail.code,
                )
            try:
                await _send_json(send, status, body)
                written = True
            except OSError:
                pass  # the status went out (or not); the body did not
        finally:
            self._generation.abort_unfinished()
            if sys.exc_info()[0] is None:  # else a bug: the 500 above
                state = classify_body(gone, failed, written)
            self._on_end(state, status)

    async def _collect(self) -> tuple[_Collected, Fail | None]:
        collected = _Collected(self._header.n)
        end: End | Fail | None = None
        # Text is kept until the end anyway: the buffer needs no byte bound.
        outbox = StreamBuffer(2**62)
        with attached(self._generation, outbox, self._live, self._limits):
            while end is None:
                await outbox.wait()
                for event in outbox.drain():
                    if isinstance(event, Delta):
                        collected.add(event)
                    elif isinstance(event, End | Fail):
                        end = event
                        break
        return collected, end if isinstance(end, Fail) else None

    def _payload(self, collected: _Collected) -> dict[str, Any]:
        texts = ["".join(parts) for parts in collected.texts]
        choices = list(zip(texts, self._generation.finish_reasons, strict=True))
        usage = self._generation.usage
        logprobs = (
            tuple(tuple(tokens) for tokens in collected.logprobs)
            if self._generation.wants_logprobs
            else (None,) * self._header.n
        )
        endpoint = self._header.endpoint
        joined = [join_all_parts(parts) for parts in collected.parts]
        calls = [parts.tool_calls if parts else () for parts in joined]
        thoughts = [parts.reasoning if parts else "" for parts in joined]
        if endpoint is Endpoint.CHAT:
            reasoning = None if usage.reasoning_tokens is None else thoughts
            return chat_completion(
                self._header, choices, usage, logprobs, calls, reasoning
            )
        if endpoint is Endpoint.COMPLETION:
            return text_completion(self._header, choices, usage, logprobs)
        ((text, reason),) = choices  # one output: Responses and Messages
        stop = self._generation.stop_sequences[0]
        whole = Whole(text, reason, usage, tuple(calls[0]), stop, thoughts[0])
        return whole_body(self._header, whole)


class _Collected:
    """The deltas of a non-streamed response, per choice: text pieces, logprobs,
    and tool-call fragments, joined per call once at the end
    (``join_all_parts``: linear in the fragments)."""

    def __init__(self, n: int) -> None:
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.logprobs: list[list[LogprobToken]] = [[] for _ in range(n)]
        self.parts: list[list[DeltaParts]] = [[] for _ in range(n)]

    def add(self, delta: Delta) -> None:
        self.texts[delta.index].append(delta.text)
        if delta.logprobs:
            self.logprobs[delta.index].extend(delta.logprobs)
        if delta.parts is not None:
            self.parts[delta.index].append(delta.parts)


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = dumps(payload)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
