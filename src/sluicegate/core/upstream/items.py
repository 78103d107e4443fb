"""What an ``UpstreamReader`` returns: text, tool calls, finishes, errors; its state.

Plain frozen values, one per thing the reader learned (``core/upstream/reader.py``
decides when each is returned); ``UpstreamItem`` is their union. None of them
carries an upstream's own field names or quirks. ``ReaderState`` is where a
reader is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sluicegate.core.events import FinishReason, ToolCallFragment, Usage
from sluicegate.core.logprobs import LogprobToken
from sluicegate.core.slot_init import slot_init

__all__ = [
    "PROTOCOL_ERROR_CODE",
    "ReaderState",
    "UpstreamDelta",
    "UpstreamDone",
    "UpstreamError",
    "UpstreamFinish",
    "UpstreamItem",
    "UpstreamReasoning",
    "UpstreamToolCall",
    "UpstreamTruncated",
    "UpstreamUsageRejected",
]

PROTOCOL_ERROR_CODE = "upstream_protocol_error"
"""``UpstreamError.code`` of a stream that is not an OpenAI event stream."""


@slot_init
@dataclass(frozen=True, slots=True)
class UpstreamDelta:
    """New text of choice ``index`` (non-empty; only what is new), and the
    logprobs of the tokens that carry it when the upstream sent them
    (``None`` otherwise); ``token_texts`` is each token's part of ``text``
    (they join to it; ``""`` for a token that ends inside a character), or
    ``None`` when the tokens' own strings join to it."""

    index: int
    text: str
    logprobs: tuple[LogprobToken, ...] | None = None
    token_texts: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class UpstreamReasoning:
    """New reasoning text of choice ``index`` (non-empty; chat only): the
    upstream's ``delta.reasoning_content`` or ``delta.reasoning``."""

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
    """Choice ``index`` ended; ``raw`` is the upstream's own ``finish_reason``;
    ``matched_stop`` the stop string the upstream says it stopped on (vLLM's
    ``stop_reason``, SGLang's ``matched_stop``), or ``None``; ``cut``: the
    reader ended it (``LENGTH``, ``raw`` ``"length"``) at the request's
    ``max_tokens`` output chunks, and drops the rest of it."""

    index: int
    finish_reason: FinishReason
    raw: str
    matched_stop: str | None = None
    cut: bool = False


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


@dataclass(frozen=True, slots=True)
class UpstreamUsageRejected:
    """The upstream's usage cannot be true (``core/upstream/limits.py``); no
    ``Usage`` follows, and the one returned before (if any) is void.

    Attributes:
        reason: what is wrong with it.
    """

    reason: str


UpstreamItem = (
    UpstreamDelta
    | UpstreamReasoning
    | UpstreamToolCall
    | UpstreamFinish
    | Usage
    | UpstreamUsageRejected
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
