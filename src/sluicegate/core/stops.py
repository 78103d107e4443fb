"""Stop strings with minimal holdback.

``StopMatcher`` takes the text of one choice piece by piece and returns what is
safe to send. It holds back only the longest suffix of the pending text that is a
proper prefix of some stop string, and releases it as soon as the next text rules
every stop string out.

Invariants (property-tested):

- For any split of the input into ``feed`` calls, the concatenated output (plus
  ``flush()`` when nothing matched) is the same.
- The output never contains a stop string (unless ``include_stop_str_in_output``,
  where it ends with exactly one).
- Held text is shorter than the longest stop string; each ``feed`` searches only
  the held text plus the new text, so a whole stream costs linear time in its
  length times the number of stop strings.

Which stop string wins: the one that completes first, reading the text left to
right (the moment a generator emitting one character at a time would stop). When
several complete at the same character, the longest wins (it starts earliest).
Deliberate divergence from "the earliest start": when one stop string contains
another (``"abcdef"`` and ``"bcd"``), ``"bcd"`` wins on ``"abcdef"``, because a
streaming matcher cannot know whether the longer one will complete without
holding text past a complete stop.

Spec: OpenAI API reference, "Create chat completion", ``stop`` (the returned text
does not contain the stop sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.core.errors import LocalProtocolError

__all__ = ["StopMatcher", "StopStep"]


@dataclass(frozen=True, slots=True)
class StopStep:
    """Result of ``StopMatcher.feed``.

    Attributes:
        text: safe to emit now (characters before any match).
        stop: the stop string that matched, or ``None``. After a match the matcher
            is finished and the rest of the input is discarded.
    """

    text: str
    stop: str | None = None


class StopMatcher:
    """Holds back only the longest pending suffix that is a prefix of a stop string.

    Args:
        stops: the stop strings, in any order. Empty strings are ignored (an empty
            stop would match before any text); duplicates are merged. No stop
            strings at all makes ``feed`` return its input unchanged.
        include_stop_str_in_output: when ``True``, the text of a matching step
            ends with the matched stop string instead of stopping before it
            (vLLM's parameter of the same name).
    """

    __slots__ = (
        "_closed",
        "_firsts",
        "_held",
        "_include_stop",
        "_max_held_chars",
        "_prefixes",
        "_stop",
        "_stops",
    )

    def __init__(
        self, stops: Sequence[str], *, include_stop_str_in_output: bool = False
    ) -> None:
        unique = {s for s in stops if s}
        # Longest first, so that a tie on the end position goes to the longest.
        self._stops = tuple(sorted(unique, key=lambda s: (-len(s), s)))
        self._prefixes = frozenset(s[:k] for s in unique for k in range(1, len(s)))
        self._firsts = frozenset(s[0] for s in unique)
        self._max_held_chars = max((len(s) for s in unique), default=1) - 1
        self._include_stop = include_stop_str_in_output
        self._held = ""
        self._stop: str | None = None
        self._closed = False

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings in use (non-empty, unique), longest first."""
        return self._stops

    @property
    def held(self) -> str:
        """Text held back now (a proper prefix of some stop string; ``""`` if none)."""
        return self._held

    @property
    def stop(self) -> str | None:
        """The stop string that matched, or ``None`` while none has."""
        return self._stop

    @property
    def finished(self) -> bool:
        """Whether a stop string matched (``feed`` is then no longer allowed)."""
        return self._stop is not None

    def feed(self, text: str) -> StopStep:
        """Take the next ``text`` and return what is safe to emit now.

        Args:
            text: the next characters of the choice (may be empty).

        Returns:
            ``StopStep(text)`` with the characters no stop string can claim (they
            may include text held back by earlier calls), or, when a stop string
            completes, ``StopStep(text_before_it, stop=that_stop)``: the matcher is
            then finished and everything after the stop string is discarded.

        Raises:
            LocalProtocolError: after a match or after ``flush()``.
        """
        if self._stop is not None or self._closed:
            raise LocalProtocolError(
                f"StopMatcher.feed() after {'a match' if self._stop else 'flush()'}"
            )
        return StopStep(self._release(text), self._stop)

    def flush(self) -> str:
        """Release what is held (``""`` after a match) and end the object.

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("StopMatcher.flush() called twice")
        self._closed = True
        held, self._held = self._held, ""
        return held

    def _release(self, text: str) -> str:
        """``feed`` without its checks and its ``StopStep``: the text safe to emit,
        and ``self._stop`` set on a match. ``ChoiceDecoder`` calls it once per token.
        """
        if not self._held and self._firsts.isdisjoint(text):
            # No stop string can start in ``text``: nothing to match or hold back
            # (the common case, and the only one without stop strings).
            return text
        buf = self._held + text
        match = self._earliest_match(buf)
        if match is not None:
            start, stop = match
            self._stop = stop
            self._held = ""
            end = start + len(stop) if self._include_stop else start
            return buf[:end]
        keep = self._holdback_chars(buf)
        if keep:
            self._held = buf[-keep:]
            return buf[:-keep]
        self._held = ""
        return buf

    def _earliest_match(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        best_end = len(buf) + 1
        for stop in self._stops:
            start = buf.find(stop)
            if start >= 0 and start + len(stop) < best_end:
                best, best_end = (start, stop), start + len(stop)
        return best

    def _holdback_chars(self, buf: str) -> int:
        prefixes = self._prefixes
        for k in range(min(self._max_held_chars, len(buf)), 0, -1):
            if buf[-k:] in prefixes:
                return k
        return 0
