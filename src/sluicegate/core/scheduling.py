"""Continuous batching as bookkeeping: admission by KV cells, step plans, aborts.

``BatchScheduler`` decides, for an engine that decodes many sequences in one
batch per step, which sequences run, what the next step's batch holds and when a
sequence ends. It owns no model, no thread and no lock: the engine (for example
``engines/llamacpp/engine.py``) calls it under its own lock, runs the planned batch, and
reports each sampled token back.

Invariants:
    - Admission is FIFO: the head of the queue is admitted when a slot is free
      and its prompt plus ``max_tokens`` fits in the KV cells not yet reserved;
      nobody overtakes it. So a running sequence never runs out of cells.
    - A step holds one token per decoding sequence, then prompt chunks of the
      prefilling ones in admission order, ``step_tokens`` tokens at most. While
      more sequences decode than prompts are read, the prompts that are cut
      hold ``chunk_tokens`` of it together (or the pacer's, sized from step
      times for at least ``slots - 1`` decoding sequences and never below a
      quarter of ``chunk_tokens``): long prompts lengthen the steps of the
      decoding majority by a bounded chunk, the oldest prompt read first, and
      short prompts arriving together are read at once. While as many prompts
      are read as sequences decode, or more, the prompts get the whole step:
      streams waiting for their first token are then no fewer than those
      waiting for their next (four ~1,000-token prompts arriving together,
      the first decoding: llama-server reads them all before any decodes).
    - A prompt whose unread part is at most ``chunk_tokens`` is read in one
      step, never cut: when the step's budget left after other prompts'
      chunks cannot hold it, it waits for the next step. llama.cpp's
      arithmetic depends on how a prompt is cut into steps, so two identical
      short prompts, one read alone and one among decoding sequences, are cut
      alike whatever the pacer has learnt, and a temperature-0 answer to them
      is the same.
    - ``abort()`` ends a queued sequence at once; a prefilling or decoding one is
      flagged and leaves at the next ``reap()``. Tokens accepted after the flag
      are waste: they end nothing and are never delivered.
    - Each sequence leaves once (``reap``, ``release``, ``drain``); its slot and
      its reserved cells come back then, and its KV cells stay held for the
      next prompt that starts with the same tokens (``PrefixCache``), unless it
      left by ``drain`` or ``release(keep_cells=False)``. What the engine must
      remove from its KV memory comes from ``take_trims``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from sluicegate.core.errors import EngineUnavailable, RequestError
from sluicegate.core.events import FinishReason
from sluicegate.core.pacing import PrefillPacer
from sluicegate.core.prefix_cache import PrefixCache
from sluicegate.core.sequences import Phase, PlannedChunk, Scheduled

__all__ = ["BatchScheduler", "Phase", "PlannedChunk", "Scheduled"]

_S = TypeVar("_S", bound=Scheduled)


class BatchScheduler(Generic[_S]):
    """Which sequences run, and what each step's batch holds.

    Args:
        kv_cells: KV cells shared by every sequence (tokens); also the longest
            sequence (prompt + completion) that can ever run.
        slots: sequences decoded together (>= 1).
        step_tokens: tokens in one step, decode tokens and prefill chunks
            together (>= ``slots``).
        chunk_tokens: tokens of the prompts cut in one step while any
            sequence decodes (>= 1; default ``step_tokens``); with
            ``step_ratio``, the first such chunk, and four times the smallest.
            A prompt no longer than this is never cut.
        step_ratio: size that chunk from the step times given to ``advance``
            so that such a step takes about this multiple of a decode-only
            one of ``slots - 1`` sequences, or of as many as decode if more,
            measured now or before the read began, whichever is shorter
            (> 1; ``PrefillPacer``); default: ``chunk_tokens`` always.
        queue_limit: sequences that may wait for admission.
        prefix_cache: where the cells of sequences that left are held for
            reuse; default: none held (every slot left is trimmed).

    Raises:
        ValueError: ``slots`` < 1, ``step_tokens`` < ``slots`` or
            ``step_ratio`` <= 1.
    """

    def __init__(
        self,
        *,
        kv_cells: int,
        slots: int,
        step_tokens: int,
        queue_limit: int,
        chunk_tokens: int | None = None,
        prefix_cache: PrefixCache | None = None,
        step_ratio: float | None = None,
    ) -> None:
        if slots < 1 or step_tokens < slots:
            raise ValueError(
                f"expected 1 <= slots <= step_tokens; got {slots!r}, {step_tokens!r}"
            )
        self.kv_cells = kv_cells
        self.step_tokens = step_tokens
        self.chunk_tokens = max(1, chunk_tokens or step_tokens)
        self.pacer = None
        """Sizes the chunk when ``step_ratio`` is given."""
        if step_ratio is not None:
            # The floor bounds a long read however slow other work makes the
            # measured steps; a quarter, since a whole chunk_tokens (32) beside
            # 15 decoding streams already doubles a step (docs/performance.md).
            # Sized for slots - 1 decoding sequences, the most that decode
            # beside one prompt: fewer pay no more together, and the prompts
            # (4 of ~1,000 tokens at once) are read in larger chunks.
            self.pacer = PrefillPacer(
                step_ratio=step_ratio,
                first_chunk_tokens=self.chunk_tokens,
                min_chunk_tokens=max(1, self.chunk_tokens // 4),
                full_batch=max(1, slots - 1),
            )
        self.queue_limit = queue_limit
        self.waiting: deque[_S] = deque()
        """Sequences waiting for admission, oldest first."""
        self.running: dict[str, _S] = {}
        """Sequences admitted and not gone, by request id, in admission order."""
        self._by_id: dict[str, _S] = {}
        self._free_slots = list(range(slots - 1, -1, -1))
        self._reserved = 0
        self._paced = False  # whether the last plan's prompt chunks were paced
        self.cache = prefix_cache or PrefixCache(enabled=False)
        """The cells held by free slots, and the trims the engine owes."""

    @property
    def idle(self) -> bool:
        """Whether no sequence waits or runs."""
        return not self.waiting and not self.running

    @property
    def reserved_cells(self) -> int:
        """KV cells reserved by the running sequences (tokens)."""
        return self._reserved

    @property
    def kv_cells_used(self) -> int:
        """KV cells the running sequences hold now (tokens)."""
        return sum(seq.kv_cells for seq in self.running.values())

    def get(self, request_id: str) -> _S | None:
        """The queued or running sequence ``request_id``, or ``None``."""
        return self._by_id.get(request_id)

    def check(self, prompt: tuple[int, ...], max_tokens: int) -> None:
        """Refuse a request that can never run, whatever the load.

        Raises:
            RequestError: the prompt plus ``max_tokens`` exceeds ``kv_cells``
                (``context_length_exceeded``), or the prompt is empty.
        """
        need = len(prompt) + max_tokens
        if need > self.kv_cells:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens and max_tokens is "
                f"{max_tokens}: {need} tokens do not fit the {self.kv_cells}-token "
                "context",
                param="max_tokens",
                code="context_length_exceeded",
            )
        if not prompt:
            raise RequestError("the prompt has no tokens", param="prompt")

    def submit(self, seq: _S) -> None:
        """Queue ``seq`` (checked with ``check()``) behind the waiting ones.

        Raises:
            EngineUnavailable: ``queue_limit`` sequences wait already.
            RequestError: a sequence with the same request id is held.
        """
        if len(self.waiting) >= self.queue_limit:
            raise EngineUnavailable(
                f"{len(self.waiting)} requests are waiting; the limit is "
                f"{self.queue_limit}"
            )
        if seq.request_id in self._by_id:
            raise RequestError(f"request id {seq.request_id!r} is already running")
        self._by_id[seq.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str) -> _S | None:
        """Flag ``request_id`` to leave; a queued one leaves now.

        Returns:
            The sequence when it left the queue now (``Phase.DONE``); ``None``
            when it is flagged to leave at the next ``reap()``, was flagged
            already, or is unknown.
        """
        seq = self._by_id.get(request_id)
        if seq is None or seq.abort_requested:
            return None
        seq.abort_requested = True
        if seq.phase is not Phase.QUEUED:
            return None
        self.waiting.remove(seq)
        self._forget(seq)
        return seq

    def flag_all(self) -> None:
        """Flag every held sequence to leave (the engine is closing)."""
        for seq in self._by_id.values():
            seq.abort_requested = True

    def reap(self) -> list[_S]:
        """The running sequences flagged by ``abort()``, removed (slot and cells
        given back, the cells held for reuse); the engine frees the rest of
        their model state."""
        reaped = [seq for seq in self.running.values() if seq.abort_requested]
        for seq in reaped:
            self.release(seq)
        return reaped

    def admit(self) -> list[_S]:
        """Admit from the head of the queue while a slot and cells are free.

        Each gets the free slot whose held cells share the longest prefix
        with its prompt (``PrefixCache.claim``): ``n_prompt_done`` and
        ``n_cached`` start at the reused tokens. Held cells are evicted, oldest
        first, as far as the new reservations need.

        Returns:
            The sequences admitted now (``Phase.PREFILL``, with a slot), in order.
        """
        admitted = []
        waiting = self.waiting
        while waiting and self._free_slots:
            seq = waiting[0]
            if self._reserved + seq.reserved_cells > self.kv_cells:
                break  # FIFO: the head waits for cells; nobody overtakes it
            waiting.popleft()
            seq.slot, reused = self.cache.claim(seq.prompt, self._free_slots)
            self._free_slots.remove(seq.slot)
            seq.n_prompt_done = seq.n_cached = reused
            seq.phase = Phase.PREFILL
            self._reserved += seq.reserved_cells
            self.cache.evict(self.kv_cells - self._reserved)
            self.running[seq.request_id] = seq
            admitted.append(seq)
        return admitted

    def plan(self) -> list[PlannedChunk[_S]]:
        """The next step's batch: every decoding sequence's last token, then
        prompt chunks of the prefilling ones in admission order, within
        ``step_tokens`` (and, when more sequences decode than prompts are
        read, the prompts cut in it hold ``chunk_tokens``, or the pacer's,
        together; none on the pacer's probe). A prompt with at most
        ``chunk_tokens`` left that does not fit what other prompts left of the
        budget waits whole for the next step. Empty when nothing runs."""
        plan: list[PlannedChunk[_S]] = []
        budget = self.step_tokens
        running = self.running.values()
        for seq in running:
            if seq.phase is Phase.DECODE:
                pos = len(seq.prompt) + seq.n_generated - 1
                plan.append(PlannedChunk(seq, (seq.last_token,), pos, True))
                budget -= 1
        most, pacer, reading = budget, self.pacer, False
        prefilling = sum(seq.phase is Phase.PREFILL for seq in running)
        self._paced = len(plan) > prefilling
        if self._paced:
            most = pacer.chunk_tokens(len(plan)) if pacer else self.chunk_tokens
        probe = most <= 0
        for seq in running:
            if seq.phase is not Phase.PREFILL or probe:
                continue
            done = seq.n_prompt_done
            left = len(seq.prompt) - done
            short = left <= self.chunk_tokens
            take = min(budget, left) if short else min(budget, most, left)
            # A short prompt cut by the budget alone waits (see the invariants);
            # the first prompt of a step is cut all the same, or it never runs.
            if take <= 0 or (short and reading and take < left):
                continue
            plan.append(
                PlannedChunk(seq, seq.prompt[done : done + take], done, take == left)
            )
            budget -= take
            most -= 0 if short else take
            reading = True
        return plan

    def advance(self, plan: list[PlannedChunk[_S]], elapsed_s: float = -1.0) -> int:
        """``plan``'s step ran, in ``elapsed_s`` seconds (told to the pacer, if
        any, unless its prompt chunks were not paced; negative: not measured):
        its prompt chunks are in the KV cache.

        Returns:
            The prompt tokens the step read (tokens).
        """
        read, decoding = 0, sum(c.seq.phase is Phase.DECODE for c in plan)
        for chunk in plan:
            seq = chunk.seq
            if seq.phase is Phase.PREFILL:
                seq.n_prompt_done += len(chunk.tokens)
                read += len(chunk.tokens)
                if seq.n_prompt_done == len(seq.prompt):
                    seq.phase = Phase.DECODE
        # A step that read prompts unpaced would teach the pacer the cost of a
        # large chunk, below a small one's: the next paced chunks would overrun.
        if self.pacer is not None and (self._paced or not read):
            self.pacer.observe(decoding, read, elapsed_s)
        return read

    def accept(self, seq: _S, token: int) -> FinishReason | None:
        """``seq`` sampled ``token`` in the step just run.

        Returns:
            Why the token ends the sequence (``STOP`` for a stop id, ``LENGTH`` at
            ``max_tokens``), else ``None``; always ``None`` for a flagged
            sequence (the token is waste). The engine ``release()``-s a sequence
            that ended.
        """
        seq.n_generated += 1
        seq.last_token = token
        seq.generated.append(token)
        if seq.abort_requested:
            return None
        if token in seq.stop_ids:
            return FinishReason.STOP
        if seq.n_generated >= seq.max_tokens:
            return FinishReason.LENGTH
        return None

    def release(self, seq: _S, *, keep_cells: bool = True) -> None:
        """Remove running ``seq``: its slot and reserved cells come back, and its
        KV cells are held for reuse (``keep_cells=False``: trimmed, when what
        they hold is not known, as after a failed step)."""
        self._free_slots.append(seq.slot)
        self._reserved -= seq.reserved_cells
        del self.running[seq.request_id]
        self._forget(seq)
        if keep_cells:
            self.cache.keep(seq.slot, seq.cell_tokens)
        else:
            self.cache.drop(seq.slot)

    def take_trims(self) -> list[tuple[int, int]]:
        """What the engine must remove from its KV memory before the next step:
        ``(slot, first position)`` pairs, in order (``PrefixCache.take_trims``)."""
        return self.cache.take_trims()

    def drain(self) -> tuple[list[_S], list[_S]]:
        """Remove every sequence: ``(running, queued)`` as they were.

        The running ones are released (slots and cells back); the engine frees
        their model state, if it still can.
        """
        running = list(self.running.values())
        for seq in running:
            self.release(seq, keep_cells=False)
        self.cache.evict(0)
        queued = list(self.waiting)
        self.waiting.clear()
        for seq in queued:
            self._forget(seq)
        return running, queued

    def __iter__(self) -> Iterator[_S]:
        """The held sequences: running ones, then queued ones."""
        return iter([*self.running.values(), *self.waiting])

    def _forget(self, seq: _S) -> None:
        seq.phase = Phase.DONE
        self._by_id.pop(seq.request_id, None)
