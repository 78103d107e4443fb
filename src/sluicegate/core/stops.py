"""Stop strings with minimal holdback.

``StopPattern`` is the stop strings of one request, compiled once (an
Aho-Corasick automaton over their characters) and shared by its choices;
``compile_stops`` also shares it with later requests that send the same short
stop strings. ``StopMatcher`` takes the text of one choice piece by piece and
returns what is safe to send. A matcher holds back only
the longest suffix of the pending text that is a proper prefix of some stop
string, and releases it as soon as the next text rules every stop string out.

Invariants (property-tested):

- For any split of the input into ``feed`` calls, the concatenated output (plus
  ``flush()`` when nothing matched) is the same, and matchers that share one
  ``StopPattern`` do not affect each other.
- The output never contains a stop string (unless ``include_stop_str_in_output``,
  where it ends with exactly one).
- Held text is shorter than the longest stop string.

Costs: compiling is linear in the total length of the stop strings (time and
memory: about 10 bytes per character). A matcher's own state is one automaton
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

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sluicegate.core.errors import LocalProtocolError

__all__ = ["StopMatcher", "StopPattern", "StopStep", "compile_stops"]


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


class StopPattern:
    """The stop strings of one request, compiled once; immutable and shared by the
    matchers of all its choices (``StopMatcher(pattern)``).

    Args:
        stops: the stop strings, in any order. Empty strings are ignored (an empty
            stop would match before any text); duplicates are merged.

    The automaton's states are the distinct prefixes of the stop strings (the
    nodes of their trie, numbered in depth-first order, so that a node's first
    child is the next node), each with its failure link: the state of its
    longest proper suffix that is also a prefix of a stop string. Set-up and
    memory are linear in the total length of the stop strings.
    """

    __slots__ = (
        "_branches",
        "_depths",
        "_fail",
        "_firsts",
        "_hits",
        "_nexts",
        "_root",
        "_runs",
        "_sorted",
        "_stops",
        "_terminals",
    )

    def __init__(self, stops: Iterable[str]) -> None:
        ordered = tuple(sorted({s for s in stops if s}))  # depth-first numbering
        # Longest first, as ``StopMatcher.stops`` shows them.
        self._stops = tuple(sorted(ordered, key=lambda s: (-len(s), s)))
        self._sorted = ordered
        # Node v > 0 is the prefix of length depths[v] of the stop string whose
        # run of new nodes holds it (the run starting at the largest runs[i] <= v);
        # nexts[v] is the character into node v + 1, v's first child when v has
        # children; other children are in branches[v], the root's in root.
        self._runs: list[int] = []
        self._depths = array("i", [0])
        self._root: dict[str, int] = {}
        self._branches: dict[int, dict[str, int]] = {}
        self._terminals: dict[int, str] = {}
        pieces: list[str] = []
        parents, leaves = self._build_trie(pieces)
        self._nexts = "".join(pieces) + "\0"  # nexts[last node]: any character
        self._firsts = frozenset(self._root)
        self._fail = array("i", bytes(4 * len(self._depths)))
        # hits[v]: a stop string ends at node v (v's own or a suffix's).
        self._hits = bytearray(len(self._depths))
        for node in self._terminals:
            self._hits[node] = 1
        self._link(parents, leaves)

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings in use (non-empty, unique), longest first."""
        return self._stops

    @property
    def states(self) -> int:
        """Automaton states: the root and one per distinct prefix of a stop string
        (at most 1 + the total length of the stop strings)."""
        return len(self._depths)

    def _build_trie(self, pieces: list[str]) -> tuple[list[int], set[int]]:
        """Insert the sorted stop strings, each new part of one as a run of nodes
        (appended to ``pieces``); return each run's parent and the leaves."""
        depths, runs, root = self._depths, self._runs, self._root
        parents: list[int] = []
        leaves: set[int] = set()
        path: list[int] = []  # the runs on the previous string's path, by depth
        prev = ""
        for stop in self._sorted:
            shared = _common_prefix(prev, stop)
            while path and depths[runs[path[-1]]] > shared:
                path.pop()
            start = len(depths)
            if not shared:
                parent = 0
                root[stop[0]] = start
            else:
                top = runs[path[-1]]
                parent = top + shared - depths[top]
                if parent in leaves:  # prev ends there: start is its first child
                    leaves.discard(parent)
                else:
                    self._branches.setdefault(parent, {})[stop[shared]] = start
            parents.append(parent)
            path.append(len(runs))
            runs.append(start)
            depths.extend(range(shared + 1, len(stop) + 1))
            pieces.append(stop[shared:])
            leaves.add(len(depths) - 1)
            self._terminals[len(depths) - 1] = stop
            prev = stop
        return parents, leaves

    def _link(self, parents: list[int], leaves: set[int]) -> None:
        """Failure links and ``hits``, breadth first (a link is always shallower)."""
        runs, depths, ordered = self._runs, self._depths, self._sorted
        fail, hits, nexts = self._fail, self._hits, self._nexts
        branches, root = self._branches, self._root
        # A run is active at depth d when it has a node there (then its node of
        # depth d is offset + d); the active list changes only where a run starts
        # or ends, and filtering it costs the nodes of one depth: linear in all.
        starting: dict[int, list[tuple[str, int, int, int]]] = {}
        for run, start in enumerate(runs):
            entry = (ordered[run], start - depths[start], start, parents[run])
            starting.setdefault(depths[start], []).append(entry)
        ending = {len(s) + 1 for s in ordered}
        active = starting.get(1, [])  # depth 1: links to the root
        for depth in range(2, max(map(len, ordered), default=0) + 1):
            if depth in starting or depth in ending:
                active = [e for e in active if len(e[0]) >= depth]
                active += starting.get(depth, [])
            for text, offset, start, parent in active:
                node = offset + depth
                char = text[depth - 1]
                state = fail[node - 1 if node > start else parent]
                while state:
                    if nexts[state] == char and state not in leaves:
                        state += 1
                        break
                    branch = branches.get(state)
                    if branch is not None and char in branch:
                        state = branch[char]
                        break
                    state = fail[state]
                else:
                    state = root.get(char, 0)
                fail[node] = state
                if hits[state]:
                    hits[node] = 1

    def _text(self, node: int) -> str:
        """The prefix that ``node`` stands for."""
        run = bisect_right(self._runs, node) - 1
        return self._sorted[run][: self._depths[node]] if run >= 0 else ""

    def _longest_stop_at(self, node: int) -> str:
        """The longest stop string that ends at ``node`` (``hits[node]`` is set)."""
        terminals, fail = self._terminals, self._fail
        while node not in terminals:
            node = fail[node]
        return terminals[node]


# Patterns by their stop strings, for short ones: most requests send none, or the
# same few (a chat template's end markers), and a pattern is immutable, so requests
# share them. Cleared when full: bounded, and it follows what is being asked.
_PATTERNS: dict[tuple[str, ...], StopPattern] = {}
_MAX_PATTERNS = 256
_MAX_SHARED_CHARS = 256  # total length of the stop strings of a shared pattern


def compile_stops(stops: Iterable[str]) -> StopPattern:
    """``StopPattern(stops)``, or an equal one made before (for short stop strings).

    Args:
        stops: the stop strings, in any order (see ``StopPattern``).

    Returns:
        The compiled pattern; immutable, so it may be shared by any matchers.
    """
    key = tuple(stops)
    pattern = _PATTERNS.get(key)
    if pattern is None:
        pattern = StopPattern(key)
        if sum(map(len, key)) <= _MAX_SHARED_CHARS:
            if len(_PATTERNS) >= _MAX_PATTERNS:
                _PATTERNS.clear()
            _PATTERNS[key] = pattern
    return pattern


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


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
