"""Prefix reuse as bookkeeping: the tokens left in free slots' KV cells.

When a sequence leaves its slot, the KV cells it wrote (its prompt, and every
generated token that was fed back) can stay where they are. ``PrefixCache``
remembers them, per free slot; a new prompt that starts with the same tokens is
given that slot and starts its prefill after the shared part, which it then
reports as cached. It owns no model: like ``BatchScheduler``, which holds one,
it says what the engine must remove from its KV memory (``take_trims``: a slot
and the first position to drop), and the engine does it before the next step.

Invariants:
    - A slot's cells are either a running sequence's or held here, never both;
      ``cells`` counts the held ones (tokens).
    - A reused prefix is shorter than the prompt (at least one prompt token is
      read again, so the step has logits to sample from) and at least
      ``min_tokens`` long; a shorter match is not worth a slot's cache, and the
      prompt gets an empty slot, else the one held longest.
    - ``evict(room)`` drops whole caches, oldest first, until ``cells <= room``;
      held cells never keep a request from being admitted.
    - Disabled (``enabled=False``), nothing is held: a sequence that leaves is
      trimmed from position 0 at once.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PrefixCache", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (tokens).

    A binary search over slice comparisons, so the token-by-token work runs in
    C: about log2(len) slices, not one Python step per token.
    """
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # a[:lo] == b[:lo] always holds
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """The token ids held in the KV cells of free slots, oldest first.

    Args:
        enabled: hold cells at all; ``False`` trims every slot left.
        min_tokens: the shortest prefix worth reusing (tokens, >= 1).
    """

    def __init__(self, *, enabled: bool = True, min_tokens: int = 16) -> None:
        self.enabled = enabled
        self.min_tokens = max(1, min_tokens)
        self._held: dict[int, tuple[int, ...]] = {}
        self._trims: list[tuple[int, int]] = []
        self.cells = 0
        """KV cells held for free slots (tokens)."""

    def held(self, slot: int) -> tuple[int, ...]:
        """The tokens whose cells ``slot`` holds (``()`` for none)."""
        return self._held.get(slot, ())

    def keep(self, slot: int, tokens: tuple[int, ...]) -> None:
        """A sequence left ``slot`` with ``tokens`` (positions 0..) in its cells."""
        if not self.enabled or not tokens:
            self.drop(slot)
            return
        self._forget(slot)
        self._held[slot] = tokens
        self.cells += len(tokens)

    def drop(self, slot: int) -> None:
        """Every cell of ``slot`` goes (held or a leaving sequence's)."""
        self._forget(slot)
        self._trims.append((slot, 0))

    def claim(
        self, prompt: Sequence[int], free_slots: Sequence[int]
    ) -> tuple[int, int]:
        """The free slot for ``prompt`` and how many of its tokens it reuses.

        The slot whose held tokens share the longest prefix with ``prompt``
        (at most ``len(prompt) - 1``, at least ``min_tokens``); else an empty
        slot, else the one held longest. Its cells past the reused prefix are
        trimmed; the reused ones now belong to the prompt's sequence.

        Raises:
            ValueError: ``free_slots`` is empty.
        """
        if not free_slots:
            raise ValueError("claim() needs a free slot")
        best, reuse = -1, 0
        limit = len(prompt) - 1
        for slot in free_slots:
            held = self._held.get(slot)
            if held is not None:
                n = min(common_prefix(held, prompt), limit)
                if n >= self.min_tokens and n > reuse:
                    best, reuse = slot, n
        if best < 0:
            empty = [s for s in free_slots if s not in self._held]
            best = (
                empty[-1] if empty else next(s for s in self._held if s in free_slots)
            )
        held = self._held.get(best, ())
        self._forget(best)
        if len(held) > reuse:
            self._trims.append((best, reuse))
        return best, reuse

    def evict(self, room: int) -> None:
        """Drop whole caches, oldest first, until ``cells <= room`` (tokens)."""
        while self.cells > room and self._held:
            self.drop(next(iter(self._held)))

    def take_trims(self) -> list[tuple[int, int]]:
        """The removals the engine owes its KV memory, in order: ``(slot,
        first position)``, every cell of the slot from that position on."""
        trims, self._trims = self._trims, []
        return trims

    def _forget(self, slot: int) -> None:
        held = self._held.pop(slot, None)
        if held is not None:
            self.cells -= len(held)
