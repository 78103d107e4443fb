"""Stop strings compiled once: an Aho-Corasick automaton shared by matchers.

``StopPattern`` is the stop strings of one request, compiled once (an
Aho-Corasick automaton over their characters) and shared by its choices;
``compile_stops`` also shares it with later requests that send the same short
stop strings. It is immutable; ``stops.StopMatcher`` runs it, reading its arrays
directly (they are the matcher's per-character loop).

Costs: compiling is linear in the total length of the stop strings (time and
memory: about 10 bytes per character).

Spec: Aho and Corasick, "Efficient string matching: an aid to bibliographic
search", CACM 18(6), 1975.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable

__all__ = ["StopPattern", "compile_stops"]


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
