"""How many prompt tokens a step that also decodes may read, from measured step times.

A step that reads part of a prompt while other sequences decode delays each of
their next tokens by the whole step. ``PrefillPacer`` sizes that part so that
such a mixed step takes about ``step_ratio`` times a decode-only step: it learns
what a decode-only step costs and what a prompt token adds to a mixed one from
the step times the engine reports, so the chunk fits the machine it runs on (a
faster core reads more of the prompt per step, a loaded one less) and shrinks
as a long prompt's later tokens attend over more cells. It owns no clock: the
engine reports each step's wall time in seconds (``observe``), so tests feed it
made-up times.

Invariants:
    - Until a decode-only step and then a mixed one have been observed, the
      chunk is ``first_chunk_tokens``: a guess, and the size the first mixed
      steps are measured at.
    - A decode-only step is taken to cost the same per decoding sequence (the
      median of the last ``decode_window`` such steps). With fewer sequences
      than were measured, its fixed cost is then counted as the prompt's, which
      makes the chunk smaller, not larger.
    - The time a chunk may add is sized for at least ``full_batch`` decoding
      sequences: with fewer, it is what it would be beside ``full_batch`` of
      them (at the per-sequence time measured), so the decoding streams'
      delay summed over them is no larger than a full batch's, and each of
      a few decoding streams waits longer than ``step_ratio`` times its step
      while the prompts, read in larger chunks, wait less.
    - After ``probe_every`` mixed steps in a row the chunk is 0: one step
      decodes alone and is measured. A decoding token's step grows as a long
      prompt's cells join a unified KV memory (its attention spans them), and
      a decode-only time measured before the prompt came would count that
      growth as the prompt's and shrink its chunks towards one token.
    - A mixed step is sized against the smaller of the decode-only step
      measured now (the probes) and the one measured before the read began
      (the last decode-only step that was not a probe: one of two or more in
      a row): the growth above then comes out of the prompt's chunk, not out
      of the decoding streams' gaps, which are compared with the ones they had
      before the prompt came.
    - What a prompt token adds is the mixed steps' time beyond a decode-only
      step, summed over the last ``window`` mixed steps and divided by their
      prompt tokens, so one step slowed by other work moves it by a share.
      Each mixed step's decode-only part is the smaller of the estimate when
      it ran and the estimate now: an estimate that was too slow (learnt while
      other work slowed the machine) is taken back from the steps measured
      against it once a faster one replaces it, and a decode-only step that
      grows during a read is not counted as the prompt's.
    - A mixed step faster than the decode-only estimate shows the estimate
      too slow: the next step is a probe (chunk 0), and its time replaces the
      estimate instead of joining the median. Otherwise each mixed step's
      prompt tokens would seem to cost nothing or less, and the chunk would
      double step by step (the bound below) until one step ran many times
      the planned time.
    - Otherwise the chunk is at least ``min_chunk_tokens`` (a prompt always
      advances, and by a bounded number of steps however slow the machine's
      steps are made by other work) and at most twice the largest chunk among
      those mixed steps (one fast step cannot make the next one long), or
      ``min_chunk_tokens`` if that is larger.

Deliberate divergence: the bound is on a step's expected time, not on the gap a
client sees; a step slowed by other work on the machine is longer than planned.
"""

from __future__ import annotations

import statistics
from collections import deque

__all__ = ["PrefillPacer"]


class PrefillPacer:
    """Sizes the prompt chunk of a step in which other sequences decode.

    Args:
        step_ratio: the time a mixed step may take, as a multiple of a
            decode-only step of the same sequences (> 1).
        first_chunk_tokens: the chunk before both kinds of step have been
            observed (tokens, >= 1).
        min_chunk_tokens: the smallest chunk but a probe's 0 (tokens, >= 1).
        window: mixed steps the prompt token's cost is taken over (>= 1).
        decode_window: decode-only steps a decode-only step's time is the
            median of (>= 1).
        probe_every: mixed steps in a row before one decodes alone (>= 1).
        full_batch: the fewest decoding sequences a chunk is sized for (>= 1;
            1: as many as decode).

    Raises:
        ValueError: ``step_ratio`` <= 1, or a count below 1.
    """

    def __init__(
        self,
        *,
        step_ratio: float,
        first_chunk_tokens: int,
        min_chunk_tokens: int = 1,
        window: int = 16,
        decode_window: int = 5,
        probe_every: int = 8,
        full_batch: int = 1,
    ) -> None:
        counts = (
            first_chunk_tokens,
            min_chunk_tokens,
            window,
            decode_window,
            probe_every,
            full_batch,
        )
        if step_ratio <= 1 or min(counts) < 1:
            raise ValueError(
                "expected step_ratio > 1 and counts >= 1; got "
                f"{step_ratio!r}, {counts!r}"
            )
        self.step_ratio = step_ratio
        self.first_chunk_tokens = first_chunk_tokens
        self.min_chunk_tokens = min_chunk_tokens
        self.probe_every = probe_every
        self.full_batch = full_batch
        self._decode_s_per_seq: deque[float] = deque(maxlen=decode_window)
        # (prompt tokens, seconds, decoding sequences, decode-only estimate per
        # sequence when it ran) of each mixed step
        self._mixed: deque[tuple[int, float, int, float]] = deque(maxlen=window)
        self._stale = False  # a mixed step ran faster than the estimate
        self._mixed_in_a_row = 0
        self._decode_in_a_row = 0
        self._before_s_per_seq: float | None = None  # before the read began

    def decode_step_s(self, decoding: int) -> float | None:
        """The expected time of a decode-only step of ``decoding`` sequences
        (seconds), or ``None`` before one was observed."""
        if not self._decode_s_per_seq:
            return None
        return statistics.median(self._decode_s_per_seq) * decoding

    def prompt_token_s(self) -> float | None:
        """What one prompt token adds to a mixed step (seconds), or ``None``
        before a mixed step was observed after a decode-only one (or while the
        mixed steps took no longer than a decode-only step, or too little
        longer for a float: a cost that rounds to 0 s would make any chunk
        fit)."""
        if not self._mixed:
            return None
        now_s = statistics.median(self._decode_s_per_seq)
        tokens = sum(n for n, _, _, _ in self._mixed)
        extra_s = sum(s - min(then, now_s) * d for _, s, d, then in self._mixed)
        token_s = extra_s / tokens
        return token_s if token_s > 0 else None

    def chunk_tokens(self, decoding: int) -> int:
        """Prompt tokens in the next step, in which ``decoding`` sequences
        (>= 1) decode.

        Returns:
            0 after ``probe_every`` mixed steps in a row or a mixed step faster
            than the decode-only estimate (the next step decodes alone);
            ``first_chunk_tokens`` until both kinds of step were observed;
            else what fits between a decode-only step of
            ``max(decoding, full_batch)`` sequences and ``step_ratio`` times
            the smaller of that step and the one before the read began, at the
            measured cost per prompt token, at most twice the largest recent
            chunk; never below ``min_chunk_tokens`` but for the probe.
        """
        if self._stale or self._mixed_in_a_row >= self.probe_every:
            return 0
        decode_s = self.decode_step_s(max(decoding, self.full_batch))
        least = self.min_chunk_tokens
        if decode_s is None or not self._mixed:
            return max(least, self.first_chunk_tokens)
        most = max(least, 2 * max(n for n, _, _, _ in self._mixed))
        token_s = self.prompt_token_s()
        if token_s is None:
            return most
        n = max(decoding, self.full_batch)
        before_s = (
            decode_s if self._before_s_per_seq is None else self._before_s_per_seq * n
        )
        fits = int((self.step_ratio * min(before_s, decode_s) - decode_s) / token_s)
        return max(least, min(most, fits))

    def observe(self, decoding: int, prompt_tokens: int, elapsed_s: float) -> None:
        """A step ran: ``decoding`` sequences decoded one token each and
        ``prompt_tokens`` prompt tokens were read, in ``elapsed_s`` seconds.

        A step with nothing decoding (prompts alone) or nothing at all teaches
        nothing here and is ignored, as is a mixed step before any decode-only
        one (there is nothing to subtract yet). A decode-only step after a
        mixed one that ran faster than the estimate replaces the estimate.
        """
        if decoding <= 0 or elapsed_s < 0:
            return
        if prompt_tokens <= 0:
            if self._stale:
                self._decode_s_per_seq.clear()
                self._stale = False
            self._decode_s_per_seq.append(elapsed_s / decoding)
            self._mixed_in_a_row = 0
            self._decode_in_a_row += 1
            if self._decode_in_a_row > 1 or self._before_s_per_seq is None:
                self._before_s_per_seq = statistics.median(self._decode_s_per_seq)
            return
        self._mixed_in_a_row += 1
        self._decode_in_a_row = 0
        if self._decode_s_per_seq:
            then_s = statistics.median(self._decode_s_per_seq)
            self._mixed.append((prompt_tokens, elapsed_s, decoding, then_s))
            self._stale = elapsed_s < then_s * decoding
