"""One sequence of the scripted engine: its phase, script, outputs and counts.

``ScriptedEngine`` (``engine.py``) keeps a ``ScriptedSequence`` per request
and moves it through its ``Phase``s (queued, running, done) on its clock;
``kv_cells`` is what the sequence holds of the KV cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from sluicegate.core.events import EngineOutput
from sluicegate.engines.base import GenerateRequest
from sluicegate.engines.outputs import SequenceOutputs

__all__ = ["Phase", "ScriptedSequence", "kv_cells"]


class Phase(Enum):
    """Where a sequence is: waiting for a batch slot, decoding, or ended."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False, slots=True)
class ScriptedSequence:
    """One scripted sequence: its request, script, outputs and progress."""

    request: GenerateRequest
    script: Iterator[int]
    outputs: SequenceOutputs[EngineOutput]
    phase: Phase = Phase.QUEUED
    decoding: bool = False  # past the prefill delay
    step: int = 0  # the next decode step (0-based)
    due: float = 0.0  # loop time (seconds) the next step is due
    wake: int = 0  # bumped to void the sequence's entry in the clock
    pending: bool = False  # the sequence has a live entry in the clock
    generated: int = 0
    fail_at_step: int | None = None
    abort_requested: bool = False
    stop_ids: frozenset[int] = frozenset()  # ids that end it (as the params say)
    most_generated: int = 0  # max_tokens, or fewer when the context fills first


def kv_cells(seq: ScriptedSequence) -> int:
    """KV cells ``seq`` holds: its prompt and the tokens generated so far."""
    return len(seq.request.prompt_token_ids) + seq.generated
