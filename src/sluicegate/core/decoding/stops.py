"""Stop strings with minimal holdback.

``StopPattern`` (``stop_pattern.py``) is the stop strings of one request,
compiled once and shared by its choices. ``StopMatcher`` takes the text of one
choice piece by piece and returns what is safe to send. A matcher holds back
only the longest suffix of the pending text that is a proper prefix of some stop
string, and releases it as soon as the next text rules every stop string out.

Invariants (property-tested):

- For any split of the input into ``feed`` calls, the concatenated output (plus
  ``flush()`` when nothing matched) is the same, and matchers that share one
  ``StopPattern`` do not affect each other.
- The output never contains a stop string (unless ``include_stop_str_in_output``,
  where it ends with exactly one).
- Held text is shorter than the longest stop string.

Costs: a matcher's own state is one automaton
state; the held text is never copied while it grows, only when it is released.
``feed`` is amortized linear in the text fed: each character takes one step, and
the failure links it follows are paid for by the characters that went deeper
(a token that breaks a held prefix of length L takes at most L steps, and only
after L characters were fed). A text with no character that starts a stop string,
with nothing held, is returned as it is after one set test.

Which stop string wins: the one that completes first, reading the text left to
right (the moment a generator emitting one character at a time would stop). When
several complete at the same character, the longest wins (it starts earliest).
Deliberate divergence from "the earliest start": when one stop string contains
another (``"abcdef"`` and ``"bcd"``), ``"bcd"`` wins on ``"abcdef"``, because a
streaming matcher cannot know whether the longer one will complete without
holding text past a complete stop.

Spec: OpenAI API reference, "Create chat completion", ``stop`` (the returned text
does not contain the stop sequence). Aho and Corasick, "Efficient string
matching: an aid to bibliographic search", CACM 18(6), 1975.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.core.decoding.stop_pattern import StopPattern, compile_stops
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.slot_init import slot_init

# compile_stops is stop_pattern.py's; it stays exported here while
# core/decoding/response.py imports it from this module.
__all__ = ["StopMatcher", "StopStep", "compile_stops"]


@slot_init
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
        stops: the stop strings, in any order, or a ``StopPattern`` compiled from
            them (``compile_stops``: once per request, shared by its choices).
            Empty strings are ignored (an empty stop would match before any
            text); duplicates are merged. No stop strings at all makes ``feed``
            return its input unchanged.
        include_stop_str_in_output: when ``True``, the text of a matching step
            ends with the matched stop string instead of stopping before it
            (vLLM's parameter of the same name).
    """

    __slots__ = (
        "_closed",
        "_firsts",
        "_include_stop",
        "_node",
        "_pattern",
        "_stop",
        "_stops",
    )

    def __init__(
        self,
        stops: StopPattern | Sequence[str],
        *,
        include_stop_str_in_output: bool = False,
    ) -> None:
        pattern = stops if isinstance(stops, StopPattern) else compile_stops(stops)
        self._pattern = pattern
        self._stops = pattern._stops
        self._firsts = pattern._firsts
        self._include_stop = include_stop_str_in_output
        self._node = 0  # the automaton state: what is held back
        self._stop: str | None = None
        self._closed = False

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings in use (non-empty, unique), longest first."""
        return self._stops

    @property
    def pattern(self) -> StopPattern:
        """The compiled stop strings (shared with other matchers built from it)."""
        return self._pattern

    @property
    def held(self) -> str:
        """Text held back now (a proper prefix of some stop string; ``""`` if none)."""
        return self._pattern._text(self._node)

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
        held = self.held
        self._node = 0
        return held

    def _release(self, text: str) -> str:
        """``feed`` without its checks and its ``StopStep``: the text safe to emit,
        and ``self._stop`` set on a match. ``ChoiceDecoder`` calls it once per token.
        """
        node = self._node
        if not node and self._firsts.isdisjoint(text):
            # No stop string can start in ``text``: nothing to match or hold back
            # (the common case, and the only one without stop strings).
            return text
        pattern = self._pattern
        nexts, branches, fail = pattern._nexts, pattern._branches, pattern._fail
        root, hits = pattern._root, pattern._hits
        held = node
        # One step per character. Standing on a node means no stop string ended
        # there or at any suffix, so it has children and nexts[node] is its first
        # child's character (a leaf is a whole stop string).
        for end, char in enumerate(text, 1):
            while node:
                if nexts[node] == char:
                    node += 1
                    break
                branch = branches.get(node)
                if branch is not None and char in branch:
                    node = branch[char]
                    break
                node = fail[node]
            else:
                node = root.get(char, 0)
            if hits[node]:
                return self._matched(held, text, end, node)
        self._node = node
        depths = pattern._depths
        return _cut(pattern, held, text, depths[held] + len(text) - depths[node])

    def _matched(self, held: int, text: str, end: int, node: int) -> str:
        """A stop string ends at ``text[:end]``: finish, and return what precedes
        it (or ends with it, with ``include_stop_str_in_output``)."""
        pattern = self._pattern
        stop = pattern._longest_stop_at(node)
        self._stop = stop
        self._node = 0
        cut = pattern._depths[held] + end
        return _cut(pattern, held, text, cut if self._include_stop else cut - len(stop))


def _cut(pattern: StopPattern, held: int, text: str, chars: int) -> str:
    """The first ``chars`` characters of the text held at node ``held``, then
    ``text``; the held text is copied only when some of it is released."""
    held_chars = pattern._depths[held]
    if not held_chars:
        return text if chars == len(text) else text[:chars]
    if chars <= 0:
        return ""
    prefix = pattern._text(held)
    if chars <= held_chars:
        return prefix[:chars]
    return prefix + text[: chars - held_chars]
