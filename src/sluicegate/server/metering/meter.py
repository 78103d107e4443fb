"""The ledger row of one request, gathered as the request goes (``Meter``).

The app makes one ``Meter`` per generation request when it arrives, fills in the
plan, the admission grant and the generation as each is made, and the responses
call ``record`` once with the end state and status. ``record`` gives back what
the grant reserved and the request did not use, appends the row to the ledger
and observes it in the metrics.

Invariants:
    - ``record`` runs once per request, whatever its end (``recorded`` tells).
    - The row's prompt tokens are the generation's usage when there is one (an
      engine that takes text counts them itself), else the plan's.

Spec: docs/DESIGN.md, "Metering".
"""

from __future__ import annotations

import time

from sluicegate.core.endstate import EndState
from sluicegate.server.admission.keys import ANONYMOUS
from sluicegate.server.admission.quotas import Grant
from sluicegate.server.ledger.ledger import Ledger, LedgerRow
from sluicegate.server.metering.metrics import Metrics
from sluicegate.server.prepare.tokens import Plan
from sluicegate.server.streaming.generation import Generation

__all__ = ["Meter"]


class Meter:
    """What the ledger row of one request needs, gathered as the request goes."""

    __slots__ = (
        "generation",
        "grant",
        "key_id",
        "ledger",
        "metrics",
        "path",
        "plan",
        "received_at",
        "recorded",
        "response_id",
        "resumed",
    )

    def __init__(self, ledger: Ledger, response_id: str, path: str) -> None:
        self.ledger = ledger
        self.response_id = response_id
        self.path = path
        self.received_at = time.time()
        self.plan: Plan | None = None
        self.generation: Generation | None = None
        self.key_id = ANONYMOUS
        self.grant: Grant | None = None
        self.metrics: Metrics | None = None
        self.recorded = False
        self.resumed = 0
        """Times a resumable response was resumed (set before ``record``)."""

    def open(self) -> None:
        """Write this admitted request's ``open`` row (the status it will have:
        200 for a stream, 0 until a JSON answer's status is known)."""
        if not self.ledger.durable:
            return  # memory only: nothing to recover after a crash
        plan = self.plan
        status = 200 if plan is not None and plan.stream and not plan.whole else 0
        self.ledger.open(self._row(EndState.FINISHED, status), self.progress)

    def progress(self) -> tuple[int, float | None]:
        """Completion tokens so far and the first token's time, for the ledger."""
        generation = self.generation
        if generation is None:
            return 0, None
        return generation.usage.completion_tokens, generation.first_token_at

    def record(self, state: EndState, status: int) -> None:
        """Append this request's row to the ledger (once)."""
        self.recorded = True
        # As kept: a count no ledger can store (an upstream's) is repaired there.
        row = self.ledger.record(self._row(state, status))
        if self.grant is not None:  # give back what was reserved and not used
            self.grant.release(row.prompt_tokens + row.completion_tokens)
        if self.metrics is not None:
            self.metrics.observe(row)

    def _row(self, state: EndState, status: int) -> LedgerRow:
        plan, generation = self.plan, self.generation
        usage = generation.usage if generation else None
        return LedgerRow(
            request_id=self.response_id,
            endpoint=self.path,
            model=plan.header.model if plan else None,
            status=status,
            end_state=state,
            prompt_tokens=(
                usage.prompt_tokens if usage else plan.prompt_tokens if plan else 0
            ),
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reasons=generation.finish_reasons if generation else (),
            received_at=self.received_at,
            first_token_at=generation.first_token_at if generation else None,
            ended_at=time.time(),
            key_id=self.key_id,
            usage_estimated=generation.usage_estimated if generation else False,
            resumed=self.resumed,
            reasoning_tokens=(usage.reasoning_tokens or 0) if usage else 0,
        )
