"""What a llama.cpp engine counts, and the ``EngineStats`` snapshot it makes.

``Counters`` is plain state, changed and read under the engine's lock only:
tokens (prompt, generated, wasted), requests by their end, KV cells in use,
decode steps and their time, and the ids of the latest aborted requests.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sluicegate.core.scheduling import BatchScheduler
from sluicegate.engines.base import EngineStats
from sluicegate.engines.values import RECENT_IDS

__all__ = ["Counters"]


@dataclass(slots=True)
class Counters:
    """A llama.cpp engine's counters (tokens, requests, cells, steps, seconds)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    wasted_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    kv_cells_used: int = 0
    steps: int = 0
    step_time_s: float = 0.0
    last_step_tokens: int = 0
    aborted_ids: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_IDS))
    stopped_ids: set[str] = field(default_factory=set)
    """Flagged to leave because a stop string matched: finished when reaped."""

    def count_abort(self, request_id: str, stopped: bool) -> None:
        """A request that left before its end: finished when the server
        ``stopped`` it (a stop string matched), else aborted."""
        if stopped:
            self.finished += 1
        else:
            self.aborted += 1
            self.aborted_ids.append(request_id)

    def count_reaped(self, request_id: str) -> None:
        """A flagged request that left the batch: finished when a stop string
        had matched (``stopped_ids``), else aborted."""
        stopped = request_id in self.stopped_ids
        self.stopped_ids.discard(request_id)
        self.count_abort(request_id, stopped)

    def count_step(self, tokens: int, elapsed_s: float, prompt_tokens: int) -> None:
        """One decode step of ``tokens`` tokens (``prompt_tokens`` of them from
        prompts) that took ``elapsed_s`` seconds."""
        self.steps += 1
        self.step_time_s += elapsed_s
        self.last_step_tokens = tokens
        self.prompt_tokens += prompt_tokens

    def snapshot(
        self,
        scheduler: BatchScheduler[Any],
        *,
        kv_cells_total: int,
        failure: str | None,
        submit_limit: int,
    ) -> EngineStats:
        """These counters and ``scheduler``'s queue and batch, as ``EngineStats``."""
        return EngineStats(
            queued=len(scheduler.waiting),
            running=len(scheduler.running),
            kv_cells_used=self.kv_cells_used,
            kv_cells_total=kv_cells_total,
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens,
            wasted_tokens=self.wasted_tokens,
            finished_requests=self.finished,
            aborted_requests=self.aborted,
            failed_requests=self.failed,
            running_ids=tuple(scheduler.running),
            aborted_ids=tuple(self.aborted_ids),
            steps=self.steps,
            step_time_s=self.step_time_s,
            last_step_tokens=self.last_step_tokens,
            failure=failure,
            submit_limit=submit_limit,
        )
