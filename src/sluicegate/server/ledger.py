"""The request ledger: one row per request, whatever its end (in memory for now).

Every request the server answers is recorded once, when it ends: rejected before
streaming, finished, errored in band, or aborted because the client went away.
Token counts come from the server's own metering, so a client that never sees a
usage chunk is still counted.

Deliberate divergence: only the newest ``max_rows`` rows are kept, in memory; a
durable SQLite ledger replaces this later.

Spec: ../shared/DESIGN.md, "Metering" and "Every stream ends in exactly one state".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason

__all__ = ["Ledger", "LedgerRow"]


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One request, as it ended.

    Attributes:
        request_id: the response id (``chatcmpl-...``/``cmpl-...``).
        endpoint: the URL path, e.g. ``/v1/chat/completions``.
        model: the model name the response carries (``None`` if rejected before
            the model was known).
        status: the HTTP status sent (200 for every stream that started; 499
            when the client left before any status was sent).
        end_state: rejected, finished, errored or aborted.
        prompt_tokens: prompt length (tokens; 0 if rejected before tokenizing).
        completion_tokens: tokens received from the engine, summed over choices,
            including those received before an abort or error.
        finish_reasons: per choice, its finish reason or ``None``.
        received_at, first_token_at, ended_at: Unix times (seconds);
            ``first_token_at`` is ``None`` when no token arrived.
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


class Ledger:
    """An append-only list of ``LedgerRow`` (oldest first), kept in memory.

    Args:
        max_rows: the most rows kept; older rows are dropped first.
    """

    def __init__(self, max_rows: int = 100_000) -> None:
        self._rows: deque[LedgerRow] = deque(maxlen=max_rows)

    @property
    def rows(self) -> list[LedgerRow]:
        """A copy of the rows, oldest first."""
        return list(self._rows)

    def record(self, row: LedgerRow) -> None:
        """Append ``row``."""
        self._rows.append(row)

    def find(self, request_id: str) -> LedgerRow | None:
        """The row of ``request_id``, or ``None``."""
        return next((r for r in self._rows if r.request_id == request_id), None)
