"""What a finished stream tells its client: frozen values, no behaviour.

A ``StreamResult`` is built once, when a stream ends in whatever way, and is the
client's whole verdict on it: the end state (``sluicegate.core.endstate``), the
text and finish reason of every choice, usage, the in-band or rejection error,
and the timing of the events. Times are seconds from ``time.monotonic``-style
clocks, measured from the moment the request was sent.

Spec: docs/DESIGN.md, "End states".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sluicegate.core.endstate import EndState
from sluicegate.core.events import Usage

__all__ = [
    "ChoiceResult",
    "StreamResult",
    "TextDelta",
    "TimeoutKind",
    "Timing",
    "ToolCall",
]


class TimeoutKind(StrEnum):
    """Which client-side time limit ran out (the value names the limit)."""

    CONNECT = "connect"
    """No TCP (or TLS) connection within ``connect_s``."""
    FIRST_BYTE = "first_byte"
    """No response head (status line and headers) within ``first_byte_s``."""
    IDLE = "idle"
    """No body byte (event or comment) for ``idle_s`` after the head."""
    TOTAL = "total"
    """The whole exchange took longer than ``total_s``."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text of choice ``index``, as one event delivered it.

    Attributes:
        index: the choice index (``choices[].index`` on the wire).
        text: the chat ``delta.content`` or completion ``text`` (Responses
            ``output_text.delta``, Messages ``text_delta``); ``""`` when the
            event carried only reasoning.
        reasoning: the reasoning the event carried (chat ``reasoning_content``,
            else ``reasoning``; Responses ``reasoning_text.delta``; Messages
            ``thinking_delta``), ``""`` for none. ``text`` or ``reasoning`` is
            never empty.

    .. versionchanged:: session 18
        Events that carry only reasoning yield a ``TextDelta`` (empty ``text``),
        so a reader can show the reasoning as it streams.
    """

    index: int
    text: str
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a chat choice, assembled from fragments by ``index``.

    Attributes:
        index: position in ``delta.tool_calls`` (fragments share it).
        id: the call id from the first fragment that had one, or ``None``.
        type: usually ``"function"``; ``None`` if never sent.
        name: the function name, fragments concatenated.
        arguments: the JSON arguments text, fragments concatenated (not parsed).
    """

    index: int
    id: str | None
    type: str | None
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChoiceResult:
    """One choice of a streamed response, assembled from all its deltas.

    Attributes:
        index: the choice index.
        text: every content (chat) or text (completion) fragment, concatenated.
        finish_reason: the wire value of the choice's last chunk, or ``None``
            when the stream ended before it.
        role: the chat ``delta.role`` if one was sent (first one wins).
        logprobs: per-token entries in order: chat ``logprobs.content`` items;
            for completions one ``{"token", "logprob", "top_logprobs"}`` per
            token, built from the parallel lists.
        tool_calls: assembled tool calls whose arguments are whole JSON, by
            index: only these are safe to act on.
        incomplete_tool_calls: calls whose arguments do not parse as JSON (cut
            short by ``max_tokens``, or broken), by index; never to be run.
        reasoning: every chat ``delta.reasoning_content`` (or, when a delta has
            none, ``delta.reasoning``) fragment, concatenated; ``""`` for none.
    """

    index: int
    text: str
    finish_reason: str | None
    role: str | None = None
    logprobs: tuple[Mapping[str, Any], ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    incomplete_tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class Timing:
    """When things arrived, in seconds since the request was sent.

    Attributes:
        head_s: the response head (status and headers) arrived; ``None`` if
            never.
        first_event_s: the first dispatched data event; ``None`` if none.
        first_token_s: the first non-empty text of any choice (time to first
            token); ``None`` if none.
        end_s: the stream ended (EOF, error, timeout or close).
        gaps_s: time between consecutive activities after the head (any body
            bytes: events and heartbeat comments alike), in order.
        token_times_s: arrival time of every event that carried text.
    """

    head_s: float | None = None
    first_event_s: float | None = None
    first_token_s: float | None = None
    end_s: float = 0.0
    gaps_s: tuple[float, ...] = ()
    token_times_s: tuple[float, ...] = ()

    @property
    def max_gap_s(self) -> float:
        """The longest silence after the head, in seconds (0.0 when none)."""
        return max(self.gaps_s, default=0.0)


@dataclass(frozen=True, slots=True)
class StreamResult:
    """How one request ended, and everything the client assembled from it.

    Attributes:
        end_state: the one ``EndState`` from ``core.endstate.classify``.
        status: the HTTP status, or ``None`` when no response head came.
        choices: one entry per choice index seen (or requested), by index.
        usage: the ``usage`` object, if a chunk carried one.
        error: the in-band ``error`` object, or the rejection body's ``error``
            (``{"message": <body text>}`` when the body was not the OpenAI
            shape); ``None`` otherwise.
        events: data events dispatched, ``[DONE]`` included.
        comments: SSE comment lines (heartbeats) seen.
        saw_done: whether ``data: [DONE]`` came.
        timing: arrival times.
        headers: the response headers, names lowercased (last value wins).
        protocol_error: why the client stopped reading a malformed stream (bad
            UTF-8, bad JSON, bad chunk shape), else ``None``.
        transport_error: the connection failure (refused, reset, cut mid-body),
            else ``None``.
        timeout: which time limit ran out, else ``None``.
        resumes: times the client resumed the stream after a dropped connection
            (``Last-Event-ID``); the other fields describe the whole stream.
        raw: the body bytes as received, when the request asked to record them
            (``b""`` otherwise).
    """

    end_state: EndState
    status: int | None
    choices: tuple[ChoiceResult, ...] = ()
    usage: Usage | None = None
    error: Mapping[str, Any] | None = None
    events: int = 0
    comments: int = 0
    saw_done: bool = False
    timing: Timing = field(default_factory=Timing)
    headers: Mapping[str, str] = field(default_factory=dict)
    protocol_error: str | None = None
    transport_error: str | None = None
    timeout: TimeoutKind | None = None
    resumes: int = 0
    raw: bytes = b""

    @property
    def text(self) -> str:
        """The text of choice 0 (``""`` when there is none)."""
        return self.choices[0].text if self.choices else ""

    @property
    def finish_reason(self) -> str | None:
        """The finish reason of choice 0, or ``None``."""
        return self.choices[0].finish_reason if self.choices else None
