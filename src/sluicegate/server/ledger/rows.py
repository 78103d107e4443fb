"""The ledger's values: one request's row (``LedgerRow``) and one key's totals.

Spec: docs/DESIGN.md, "Metering" and "End states".
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason

__all__ = ["NAMES", "LedgerRow", "UsageTotal"]

NAMES = (
    "request_id",
    "key_id",
    "endpoint",
    "model",
    "status",
    "end_state",
    "prompt_tokens",
    "completion_tokens",
    "finish_reasons",
    "received_at",
    "first_token_at",
    "ended_at",
    "usage_estimated",
    "resumed",
    "reasoning_tokens",
)
"""The ledger table's columns of a row, in ``LedgerRow``'s order of meaning
(``server_id`` is the writer's, not the row's)."""


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One request, as it ended.

    Attributes:
        request_id: the response id (``chatcmpl-...``/``cmpl-...``).
        endpoint: the URL path, e.g. ``/v1/chat/completions``.
        model: the model name the response carries (``None`` if rejected before
            the model was known).
        status: the HTTP status sent (200 for every stream that started; 499
            when the client left before any status was sent; 0 for a
            non-streamed request whose server died before it answered).
        end_state: rejected, finished, errored or aborted; ``truncated`` only
            for a request whose server died before it ended (the client saw the
            connection end early, as ``classify`` calls it).
        prompt_tokens: prompt length (tokens; 0 if rejected before tokenizing).
        completion_tokens: tokens received from the engine, summed over choices,
            including those received before an abort or error (for
            ``truncated``: as of the last progress write).
        finish_reasons: per choice, its finish reason or ``None``.
        received_at, first_token_at, ended_at: Unix times (seconds);
            ``first_token_at`` is ``None`` when no token arrived. For
            ``truncated``, ``ended_at`` is the last time the row was written (the
            server was alive then).
        key_id: the API key's id (``anonymous`` without keys), never the key.
        usage_estimated: the token counts are an estimate, not the engine's own:
            an upstream server's request cut short before it reported its usage
            (what arrived is counted, one token per chunk where the upstream
            gives no counts per chunk).
        resumed: times a resumable stream was resumed (reads of its log after
            the first connection's); 0 for every other request.
        reasoning_tokens: the part of ``completion_tokens`` spent inside the
            reasoning (a model with a reasoning parser, or an upstream that
            streams reasoning); 0 for none.
    """

    request_id: str
    endpoint: str
    model: str | None
    status: int
    end_state: EndState
    prompt_tokens: int
    completion_tokens: int
    finish_reasons: tuple[FinishReason | None, ...]
    received_at: float
    first_token_at: float | None
    ended_at: float
    key_id: str = "anonymous"
    usage_estimated: bool = False
    resumed: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """Totals of one (key, end state) pair; tokens in tokens.

    ``end_state`` is ``OPEN`` (``"open"``) for requests still running, and the
    text as written for a state this version does not know (a row another
    program wrote).
    """

    key_id: str
    end_state: EndState | str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    """The part of ``completion_tokens`` spent reasoning."""
