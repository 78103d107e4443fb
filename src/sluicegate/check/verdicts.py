"""Verdicts, probe results, and the helpers every probe shares (pure).

A probe is a function ``(recording) -> ProbeResult``: its docstring's first line
is the rule it checks, and its ``Spec:`` line the source of that rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sluicegate.check.transcript import Parsed, Transcript, parse

__all__ = [
    "Probe",
    "ProbeResult",
    "Verdict",
    "choice_deltas",
    "clip",
    "fail",
    "not_observable",
    "passed",
    "streams",
    "text_of",
]


class Verdict(StrEnum):
    """The outcome of one probe."""

    PASS = "pass"
    FAIL = "fail"
    NOT_OBSERVABLE = "not-observable"
    """The recording cannot show the rule either way (the exchange is missing,
    or the server declined the feature with a 4xx)."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe's verdict.

    Attributes:
        probe: the probe's name (its function name, dashed).
        verdict: pass, fail or not-observable.
        evidence: the offending exchange, event or value; or what was checked.
        rule: the rule, one line.
        source: where the rule comes from.
    """

    probe: str
    verdict: Verdict
    evidence: str
    rule: str = ""
    source: str = ""


Probe = Callable[[Mapping[str, Transcript]], ProbeResult]


def passed(evidence: str) -> ProbeResult:
    """A pass; ``check.probes`` fills in the probe's name, rule and source."""
    return ProbeResult("", Verdict.PASS, evidence)


def fail(evidence: str) -> ProbeResult:
    """A fail with its evidence."""
    return ProbeResult("", Verdict.FAIL, evidence)


def not_observable(evidence: str) -> ProbeResult:
    """Nothing to judge, and why."""
    return ProbeResult("", Verdict.NOT_OBSERVABLE, evidence)


def streams(
    recording: Mapping[str, Transcript], *, complete: bool = True
) -> Iterator[tuple[str, Transcript, Parsed]]:
    """The streamed exchanges answered 200, parsed, in recording order.

    Args:
        complete: leave out exchanges the recorder closed early on purpose.
    """
    for name, t in recording.items():
        if t.streamed and t.status == 200 and not (complete and t.closed_early):
            yield name, t, parse(t)


def choice_deltas(parsed: Parsed) -> dict[int, list[tuple[int, Mapping[str, Any]]]]:
    """``{index: [(event position, choice object), ...]}`` over every chunk."""
    out: dict[int, list[tuple[int, Mapping[str, Any]]]] = {}
    for pos, chunk in parsed.chunks:
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and isinstance(choice.get("index"), int):
                out.setdefault(choice["index"], []).append((pos, choice))
    return out


def text_of(choice: Mapping[str, Any]) -> str:
    """The text a streamed choice object carries (chat content or completion text)."""
    delta = choice.get("delta")
    value = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return value if isinstance(value, str) else ""


def clip(value: object, limit: int = 160) -> str:
    """``repr(value)``, shortened to ``limit`` characters for a table cell."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
