"""A sequence as the batch scheduler sees it, and its part of one step's batch.

``Scheduled`` is the bookkeeping of one sequence (engines subclass it for their
own state); ``PlannedChunk`` is what ``BatchScheduler.plan`` puts in a step for
it. Both are plain values: nothing here decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

__all__ = ["Phase", "PlannedChunk", "Scheduled"]


class Phase(StrEnum):
    """Where a sequence is: waiting, reading its prompt, generating, or gone."""

    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Scheduled:
    """One sequence as the scheduler sees it; engines subclass it for their own
    state (sampler, output channel).

    Attributes:
        request_id: unique among the sequences the scheduler holds.
        prompt: the prompt's token ids (never empty).
        max_tokens: most tokens to generate (>= 1).
        stop_ids: token ids that end the sequence (EOS unless ignored, and the
            request's stop token ids).
        phase: see ``Phase``.
        slot: the batch slot (llama.cpp's sequence id) while running, else -1.
        n_prompt_done: prompt tokens already in the KV cache.
        n_cached: the part of ``n_prompt_done`` reused from an earlier
            sequence's cells at admission (tokens).
        n_generated: tokens sampled so far.
        generated: the tokens sampled so far, in order.
        last_token: the latest sampled token (fed back at the next step).
        abort_requested: the sequence leaves at the next ``reap()``.
    """

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    phase: Phase = Phase.QUEUED
    slot: int = -1
    n_prompt_done: int = 0
    n_cached: int = 0
    n_generated: int = 0
    last_token: int = -1
    abort_requested: bool = False
    generated: list[int] = field(default_factory=list)

    @property
    def reserved_cells(self) -> int:
        """KV cells reserved at admission: the prompt plus ``max_tokens``."""
        return len(self.prompt) + self.max_tokens

    @property
    def kv_cells(self) -> int:
        """Cells this sequence holds: the prompt so far, then every generated
        token but the latest, which is fed back at the next step."""
        return self.n_prompt_done + max(self.n_generated - 1, 0)

    @property
    def cell_tokens(self) -> tuple[int, ...]:
        """The tokens of the cells it holds, by position (see ``kv_cells``)."""
        done = self.prompt[: self.n_prompt_done]
        if self.n_prompt_done < len(self.prompt) or self.n_generated < 2:
            return done
        return done + tuple(self.generated[: self.n_generated - 1])


_S = TypeVar("_S", bound=Scheduled)


@dataclass(frozen=True, slots=True)
class PlannedChunk(Generic[_S]):
    """One sequence's part of the next batch.

    Attributes:
        seq: the sequence.
        tokens: its token ids in this step (one to decode, or a prompt chunk).
        first_pos: the position of ``tokens[0]`` in the sequence.
        wants_logits: sample after the last of ``tokens`` (decoding, or the
            chunk that ends the prompt).
    """

    seq: _S
    tokens: tuple[int, ...]
    first_pos: int
    wants_logits: bool
