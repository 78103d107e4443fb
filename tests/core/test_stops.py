from __future__ import annotations

import subprocess
import sys
import tracemalloc
from array import array
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.decoding import stop_pattern
from sluicegate.core.decoding.stop_pattern import StopPattern, compile_stops
from sluicegate.core.decoding.stops import StopMatcher, StopStep
from sluicegate.core.errors import LocalProtocolError

from .strategies import every_split, split_at


def reference_truncation(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """Cut ``text`` before the first stop string to complete, reading left to right;
    on a tie, the longest. Quadratic on purpose: an independent oracle."""
    candidates = [s for s in stops if s]
    for end in range(1, len(text) + 1):
        done = [s for s in candidates if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return text[: end - len(stop)], stop
    return text, None


def longest_suffix_that_is_a_proper_prefix(text: str, stops: Sequence[str]) -> str:
    for k in range(len(text), 0, -1):
        if any(len(s) > k and s.startswith(text[-k:]) for s in stops):
            return text[-k:]
    return ""


def run(matcher: StopMatcher, parts: Sequence[str]) -> tuple[str, str | None]:
    out = []
    for part in parts:
        step = matcher.feed(part)
        out.append(step.text)
        if step.stop is not None:
            return "".join(out), step.stop
    return "".join(out) + matcher.flush(), None


# --- examples ---------------------------------------------------------------------


def test_partial_stop_is_held_until_it_completes() -> None:
    matcher = StopMatcher(["###END"])
    steps = []
    for piece in ["Caf", "é", ".\n", "##", "#", "END"]:
        steps.append((matcher.feed(piece), matcher.held, matcher.finished))
    assert steps == [
        (StopStep("Caf"), "", False),
        (StopStep("é"), "", False),
        (StopStep(".\n"), "", False),
        (StopStep(""), "##", False),
        (StopStep(""), "###", False),
        (StopStep("", "###END"), "", True),
    ]
    assert matcher.stop == "###END"


def test_held_text_is_released_when_the_next_text_rules_the_stop_out() -> None:
    matcher = StopMatcher(["###END"])
    assert matcher.feed("a##") == StopStep("a")
    assert matcher.held == "##"
    assert matcher.feed("#EN!") == StopStep("###EN!")
    assert matcher.held == ""


def test_only_the_longest_suffix_that_is_a_prefix_is_held() -> None:
    matcher = StopMatcher(["abab"])
    assert matcher.feed("xaba") == StopStep("x")
    assert matcher.held == "aba"
    # "abaa": no suffix longer than "a" is a prefix of "abab".
    assert matcher.feed("a") == StopStep("aba")
    assert matcher.held == "a"
    assert matcher.feed("bab") == StopStep("", "abab")


def test_overlapping_prefix_after_a_false_start_still_matches() -> None:
    matcher = StopMatcher(["aab"])
    assert matcher.feed("a") == StopStep("")
    assert matcher.feed("a") == StopStep("")
    assert matcher.feed("a") == StopStep("a")
    assert matcher.feed("b") == StopStep("", "aab")


def test_text_after_the_stop_in_the_same_feed_is_discarded() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("one\n\ntwo") == StopStep("one", "\n\n")
    assert matcher.flush() == ""


def test_stop_at_the_very_start_gives_empty_text() -> None:
    matcher = StopMatcher(["Hi"])
    assert matcher.feed("Hi there") == StopStep("", "Hi")


def test_several_stop_strings_hold_for_any_of_them() -> None:
    matcher = StopMatcher(["###END", "\n\n", "STOP"])
    assert matcher.feed("x\n") == StopStep("x")
    assert matcher.held == "\n"
    assert matcher.feed("S") == StopStep("\n")
    assert matcher.held == "S"
    assert matcher.feed("TOP") == StopStep("", "STOP")


def test_stop_that_completes_first_wins_over_one_that_starts_earlier() -> None:
    matcher = StopMatcher(["abcdef", "bcd"])
    assert matcher.feed("xabcdef") == StopStep("xa", "bcd")


def test_longest_stop_wins_when_two_complete_at_the_same_character() -> None:
    matcher = StopMatcher(["c", "abc"])
    assert matcher.feed("xabc") == StopStep("x", "abc")
    matcher = StopMatcher(["abc", "c"])
    assert matcher.feed("xab") == StopStep("x")
    assert matcher.feed("c") == StopStep("", "abc")


def test_include_stop_str_in_output_keeps_the_matched_stop() -> None:
    matcher = StopMatcher(["###END"], include_stop_str_in_output=True)
    assert matcher.feed("a##") == StopStep("a")
    assert matcher.feed("#END tail") == StopStep("###END", "###END")


def test_no_stop_strings_pass_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything ###END") == StopStep("anything ###END")
    assert matcher.held == ""
    assert matcher.flush() == ""


def test_empty_and_duplicate_stop_strings_are_ignored() -> None:
    matcher = StopMatcher(["", "END", "END", "ab"])
    assert matcher.stops == ("END", "ab")
    assert matcher.feed("x") == StopStep("x")
    assert StopMatcher([""]).stops == ()


def test_single_character_stop_holds_nothing() -> None:
    matcher = StopMatcher(["."])
    assert matcher.feed("abc") == StopStep("abc")
    assert matcher.held == ""
    assert matcher.feed("d.e") == StopStep("d", ".")


def test_flush_releases_held_text_and_ends_the_matcher() -> None:
    matcher = StopMatcher(["###END"])
    assert matcher.feed("x##") == StopStep("x")
    assert matcher.flush() == "##"
    assert matcher.held == ""
    with pytest.raises(LocalProtocolError, match="flush"):
        matcher.feed("y")
    with pytest.raises(LocalProtocolError, match="twice"):
        matcher.flush()


def test_feed_after_a_match_raises_and_changes_nothing() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("xEND") == StopStep("x", "END")
    with pytest.raises(LocalProtocolError, match="match"):
        matcher.feed("more")
    assert matcher.stop == "END"
    assert matcher.finished
    assert matcher.flush() == ""


def test_empty_feed_keeps_held_text() -> None:
    matcher = StopMatcher(["abc"])
    assert matcher.feed("ab") == StopStep("")
    assert matcher.feed("") == StopStep("")
    assert matcher.held == "ab"


@pytest.mark.parametrize("parts", every_split("Café costs 5€.\n###END more"))
def test_every_split_of_the_lesson_text_stops_at_the_same_place(
    parts: list[str],
) -> None:
    assert run(StopMatcher(["###END"]), parts) == ("Café costs 5€.\n", "###END")


# --- properties -------------------------------------------------------------------

alphabet = st.sampled_from("ab#\né")
stop_lists = st.lists(st.text(alphabet, max_size=4), max_size=3)


@settings(max_examples=400)
@given(text=st.text(alphabet, max_size=30), stops=stop_lists, data=st.data())
def test_any_split_gives_the_reference_truncation(
    text: str, stops: list[str], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    assert run(StopMatcher(stops), split_at(text, cuts)) == reference_truncation(
        text, stops
    )


@settings(max_examples=300)
@given(text=st.text(alphabet, max_size=30), stops=stop_lists, data=st.data())
def test_emitted_text_never_contains_a_stop_and_held_text_is_minimal(
    text: str, stops: list[str], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    matcher = StopMatcher(stops)
    emitted = ""
    for part in split_at(text, cuts):
        step = matcher.feed(part)
        emitted += step.text
        for stop in matcher.stops:
            assert stop not in emitted
        if step.stop is not None:
            break
        fed = emitted + matcher.held
        assert matcher.held == longest_suffix_that_is_a_proper_prefix(fed, stops)


@settings(max_examples=200)
@given(text=st.text(alphabet, max_size=30), stops=stop_lists)
def test_include_stop_str_in_output_appends_exactly_the_stop(
    text: str, stops: list[str]
) -> None:
    before, stop = reference_truncation(text, stops)
    got = run(StopMatcher(stops, include_stop_str_in_output=True), list(text))
    assert got == (before + (stop or ""), stop)


# Deep automata: few letters, long stops sharing prefixes (failure chains, branches).
deep_stops = st.lists(st.text(st.sampled_from("ab"), max_size=12), max_size=6)


@settings(max_examples=400)
@given(
    text=st.text(st.sampled_from("abc"), max_size=60),
    stops=deep_stops,
    data=st.data(),
)
def test_long_overlapping_stops_give_the_reference_truncation(
    text: str, stops: list[str], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert run(StopMatcher(stops), split_at(text, cuts)) == reference_truncation(
        text, stops
    )
    assert StopPattern(stops).states <= 1 + sum(map(len, set(stops)))


@settings(max_examples=300)
@given(
    stops=st.one_of(stop_lists, deep_stops),
    choices=st.lists(
        st.tuples(
            st.text(st.sampled_from("ab#\né"), max_size=30),
            st.lists(st.integers(0, 30), max_size=8),
            st.booleans(),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_choices_sharing_one_pattern_each_give_the_reference_truncation(
    stops: list[str], choices: list[tuple[str, list[int], bool]]
) -> None:
    # One compiled pattern, as the server shares it across the choices of a
    # request; the choices' feeds are interleaved, one part of each in turn.
    pattern = StopPattern(stops)
    matchers = [
        StopMatcher(pattern, include_stop_str_in_output=include)
        for _, _, include in choices
    ]
    parts = [split_at(text, cuts) for text, cuts, _ in choices]
    out = ["" for _ in choices]
    ended: list[str | None] = [None for _ in choices]
    for step in range(max(map(len, parts))):
        for i, matcher in enumerate(matchers):
            if step < len(parts[i]) and not matcher.finished:
                result = matcher.feed(parts[i][step])
                out[i] += result.text
                ended[i] = result.stop
    for i, (matcher, (text, _, include)) in enumerate(
        zip(matchers, choices, strict=True)
    ):
        if not matcher.finished:
            out[i] += matcher.flush()
        before, stop = reference_truncation(text, stops)
        assert (out[i], ended[i]) == (before + (stop or "") * include, stop)
        assert matcher.pattern is pattern


class CountingReads:
    """A failure table that counts how often the matcher follows a link."""

    def __init__(self, table: array[int]) -> None:
        self.table = table
        self.reads = 0

    def __getitem__(self, node: int) -> int:
        self.reads += 1
        return self.table[node]


def counted(stops: Sequence[str], monkeypatch: pytest.MonkeyPatch) -> CountingReads:
    pattern = StopPattern(stops)
    counter = CountingReads(pattern._fail)
    monkeypatch.setattr(pattern, "_fail", counter)
    return counter


@settings(max_examples=200)
@given(
    text=st.text(st.sampled_from("abc"), max_size=80),
    stops=deep_stops,
    data=st.data(),
)
def test_links_followed_never_outnumber_the_characters_fed(
    text: str, stops: list[str], data: st.DataObject
) -> None:
    # Each link goes at least one character shallower, each character at most one
    # deeper: feeding is amortized linear, whatever the stops and the split.
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    with pytest.MonkeyPatch.context() as monkeypatch:
        pattern = StopPattern(stops)
        counter = CountingReads(pattern._fail)
        monkeypatch.setattr(pattern, "_fail", counter)
        run(StopMatcher(pattern), split_at(text, cuts))
    assert counter.reads <= len(text)


def test_a_token_that_breaks_a_long_held_prefix_costs_its_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held_chars = 40_000
    stop = "a" * held_chars + "b"
    pattern = StopPattern([stop])
    counter = CountingReads(pattern._fail)
    monkeypatch.setattr(pattern, "_fail", counter)
    matcher = StopMatcher(pattern)
    for _ in range(held_chars):
        assert matcher.feed("a") == StopStep("")
    assert counter.reads == 0  # growing the held prefix follows no link
    assert len(matcher.held) == held_chars
    assert matcher.feed("c") == StopStep("a" * held_chars + "c")
    assert counter.reads <= held_chars  # not held_chars**2 / 2
    assert matcher.held == ""
    assert matcher.feed("a" * held_chars + "b") == StopStep("", stop)


def test_setup_memory_is_linear_in_the_stop_length() -> None:
    # Every prefix of the stop, as a set of strings, would take length**2 / 2
    # bytes (32 MB here); the automaton takes about ten bytes per character.
    length = 8_000
    tracemalloc.start()
    try:
        pattern = StopPattern(["ab" * (length // 2), "ba" * (length // 4)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * (length + length // 2) + 64 * 1024
    assert pattern.states == 1 + length + length // 2


def test_a_million_character_stop_compiles_in_a_few_times_its_size() -> None:
    # In a child with its address space capped at 1 GiB: quadratic set-up would
    # end in MemoryError there, not take this machine's memory.
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from sluicegate.core.decoding.stops import StopMatcher\n"
        "stop = 'ab' * 500_000\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "matcher = StopMatcher([stop])\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "step = matcher.feed(stop[:-1] + 'x' + stop)\n"
        "assert step.stop == stop and len(step.text) == len(stop), step.stop\n"
        "print(grown * 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) < 16 * 1_000_000  # bytes, for 1 MB of stop string


def test_compile_stops_shares_patterns_of_short_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stop_pattern, "_PATTERNS", {})
    monkeypatch.setattr(stop_pattern, "_MAX_PATTERNS", 2)
    first = compile_stops(["END", "\n\n"])
    assert compile_stops(("END", "\n\n")) is first
    assert StopMatcher(["END", "\n\n"]).pattern is first
    long_stop = "x" * (stop_pattern._MAX_SHARED_CHARS + 1)
    assert compile_stops([long_stop]) is not compile_stops([long_stop])
    assert compile_stops([long_stop]).stops == (long_stop,)
    compile_stops(["a"])
    compile_stops(["b"])  # full: the table starts again
    assert len(stop_pattern._PATTERNS) <= 2
    assert compile_stops(["END", "\n\n"]) is not first


def test_pattern_lists_its_stops_longest_first_and_counts_its_states() -> None:
    pattern = StopPattern(["ab", "", "abc", "b", "ab"])
    assert pattern.stops == ("abc", "ab", "b")
    assert pattern.states == 5  # root, "a", "ab", "abc", "b"
    assert StopPattern([]).states == 1
