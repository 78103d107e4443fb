"""The ledger rows of whole plans, each waiting for its end state and its status.

A whole plan (a resumable stream whose client is answered one JSON object
once the log ends: a stored, non-streamed Responses request) is recorded once
both its stream's end state and the status its client was answered are known;
the first of each counts. At shutdown a row whose stream
ended waits a grace period for its status, then is recorded with 500.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from sluicegate.core.endstate import EndState
from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.http.errors import ResponseFailed, kind_of
from sluicegate.server.metering.meter import Meter

__all__ = ["WholeRows"]

_STOPPED = kind_of(ResponseFailed).status
"""The status of a whole answer cut off by the shutdown (a failed response's)."""


class WholeRows:
    """The rows of whole plans whose stream or answer has not ended, by id."""

    def __init__(self) -> None:
        self._rows: dict[str, _WholeRow] = {}

    def __len__(self) -> int:
        """Rows still waiting for their end state or their status."""
        return len(self._rows)

    def track(self, response_id: str, meter: Meter) -> Callable[[int], None]:
        """Keep ``meter``'s row until both ends are known; returns what to call
        with the status its client was answered."""
        whole = self._rows[response_id] = _WholeRow(meter)

        def answered(status: int) -> None:
            whole.answered(status)
            self._forget(response_id, whole)

        return answered

    def ended(self, response_id: str, state: EndState) -> bool:
        """Report the end state of ``response_id``'s stream; whether a whole
        row took it (else the caller records its own row)."""
        whole = self._rows.get(response_id)
        if whole is None:
            return False
        whole.ended(state)  # recorded with the status its client got
        self._forget(response_id, whole)
        return True

    async def aclose(self, grace_s: float, timers: Timers | None = None) -> None:
        """Wait up to ``grace_s`` seconds (on ``timers``, the running loop when
        ``None``) for the answers of rows whose stream ended, record the rest
        with 500 (what such an answer is when the server stops under it), and
        forget every row."""
        waiting = [whole for whole in self._rows.values() if whole.state is not None]
        with contextlib.suppress(TimeoutError):
            async with Deadline(timers or asyncio.get_running_loop(), grace_s):
                for whole in waiting:
                    await whole.recorded.wait()
        for whole in waiting:
            whole.answered(_STOPPED)  # nothing if its answer was reported
        self._rows.clear()

    def _forget(self, response_id: str, whole: _WholeRow) -> None:
        if whole.meter.recorded and self._rows.get(response_id) is whole:
            del self._rows[response_id]


class _WholeRow:
    """The ledger row of a whole plan: recorded once both its stream's end
    state and the status its client was answered are known (the first of
    each counts)."""

    __slots__ = ("meter", "recorded", "state", "status")

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.state: EndState | None = None
        self.status: int | None = None
        self.recorded = asyncio.Event()

    def ended(self, state: EndState) -> None:
        if self.state is None:
            self.state = state
            self._record()

    def answered(self, status: int) -> None:
        if self.status is None:
            self.status = status
            self._record()

    def _record(self) -> None:
        state, status = self.state, self.status
        if state is not None and status is not None and not self.meter.recorded:
            self.meter.record(state, status)
            self.recorded.set()
