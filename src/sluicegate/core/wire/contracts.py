"""One stream machine per wire contract, and the whole bodies of each.

Every API the server speaks is an encoder of the same stream events
(``Delta``, ``Finish``, ``End``, ``Fail``, ``Heartbeat``): chat and text
completions (``stream.StreamMachine``: OpenAI chunks, ``[DONE]``), the Responses
API (``responses.ResponsesStream``: typed events with sequence numbers, one
terminal event) and Anthropic's Messages API (``messages.MessagesStream``:
content blocks, ``message_stop``), each a ``machine.WireMachine``. Each machine
has the interface ``Wire`` names; the server's writers, its resumable producer
and its ledger use only that, so the holdback, the end states, abort and
heartbeats are the same for every API.

``whole_body`` and ``error_body`` are the non-streamed answers: the one JSON
object of a finished response, and the error body of one that failed before
any byte, each in its API's shape.

Spec: OpenAI API reference, "The chat completion chunk object" and "Streaming
events" of the Responses API; Anthropic API reference, "Messages" and
"Streaming messages".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason, StreamEvent, ToolCallFragment, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader, error_payload
from sluicegate.core.wire.messages import (
    MessagesStream,
    message_body,
    message_error_body,
)
from sluicegate.core.wire.padding import MIN_STEP_BYTES, Filler
from sluicegate.core.wire.responses import ResponsesStream, response_body
from sluicegate.core.wire.stream import StreamMachine, StreamState

__all__ = ["Whole", "Wire", "error_body", "stream_machine", "whole_body"]


class Wire(Protocol):
    """What the server asks of a stream machine (every ``machine.WireMachine``).

    ``start()`` returns the frames after the headers, ``feed(event)`` the frames
    of one event, in order; ``wrote()``/``write_failed()`` report what became of
    them, and ``outcome`` is the end state of what was written.
    """

    @property
    def header(self) -> ResponseHeader: ...

    @property
    def state(self) -> StreamState: ...

    @property
    def end_state(self) -> EndState | None: ...

    @property
    def outcome(self) -> EndState: ...

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]: ...

    def start(self) -> list[bytes]: ...

    def feed(self, event: StreamEvent) -> list[bytes]: ...

    def wrote(self) -> None: ...

    def write_failed(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Whole:
    """One whole choice of a non-streamed response: what its JSON body says.

    Attributes:
        text: the content text, stop string held back as streamed.
        finish_reason: why it ended (``None`` only for a response cut short).
        usage: the response's token counts.
        tool_calls: one whole fragment per call (``id``, ``name`` and all of
            its ``arguments``), in index order.
        stop_sequence: the stop string that ended it, when one did.
        reasoning: its reasoning text, before ``text`` (``""`` for none).
    """

    text: str
    finish_reason: FinishReason | None
    usage: Usage
    tool_calls: tuple[ToolCallFragment, ...] = ()
    stop_sequence: str | None = None
    reasoning: str = ""


def stream_machine(
    header: ResponseHeader,
    filler: Filler | None = None,
    pad_step_bytes: int = MIN_STEP_BYTES,
) -> Wire:
    """The stream machine of ``header.endpoint``'s API.

    Args:
        header: the response's shared fields; its ``endpoint`` picks the API.
        filler: pad every frame (``padding.py``); ``None`` for no padding.
        pad_step_bytes: the padding ladder's first step (bytes).

    Raises:
        ValueError: ``header.n < 1``, or ``n > 1`` for an API with one output.
    """
    endpoint = header.endpoint
    if endpoint is Endpoint.RESPONSES:
        return ResponsesStream(header, filler, pad_step_bytes)
    if endpoint is Endpoint.MESSAGES:
        return MessagesStream(header, filler, pad_step_bytes)
    return StreamMachine(header, filler, pad_step_bytes)


def whole_body(header: ResponseHeader, whole: Whole) -> dict[str, Any]:
    """The non-streamed body of a finished Responses or Messages response.

    Raises:
        ValueError: ``header.endpoint`` is chat or completions (their bodies,
            with ``n`` choices and logprobs, are ``chunks.chat_completion`` and
            ``chunks.text_completion``).
    """
    if header.endpoint is Endpoint.RESPONSES:
        return response_body(header, whole)
    if header.endpoint is Endpoint.MESSAGES:
        return message_body(header, whole)
    raise ValueError(f"no whole body for {header.endpoint!r}")


def error_body(
    endpoint: Endpoint,
    status: int,
    message: str,
    error_type: str = "server_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The error body of ``endpoint``'s API for an answer with HTTP ``status``.

    OpenAI's APIs (chat, completions, Responses): ``{"error": {"message", "type",
    "param", "code"}}``. Messages: ``{"type": "error", "error": {"type",
    "message"}}`` with Anthropic's type for the status.
    """
    if endpoint is Endpoint.MESSAGES:
        return message_error_body(status, message)
    return error_payload(message, error_type, param, code)
