"""Render probe results: a rich table for people, JSON for machines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from sluicegate.check.verdicts import ProbeResult, Verdict

__all__ = ["print_table", "results_json"]

_STYLE = {
    Verdict.PASS: "green",
    Verdict.FAIL: "bold red",
    Verdict.NOT_OBSERVABLE: "yellow",
}


def print_table(
    console: Console, results: Sequence[ProbeResult], title: str, rules: bool = False
) -> None:
    """Print one row per probe: name, verdict, evidence (and the rule if asked)."""
    table = Table(title=title, show_lines=False)
    table.add_column("probe", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("evidence", overflow="fold")
    if rules:
        table.add_column("rule (source)", overflow="fold")
    for r in results:
        row = [r.probe, f"[{_STYLE[r.verdict]}]{r.verdict}[/]", r.evidence]
        if rules:
            row.append(f"{r.rule} ({r.source})")
        table.add_row(*row, end_section=False)
    console.print(table)
    counts = {v: sum(r.verdict is v for r in results) for v in Verdict}
    console.print(", ".join(f"{n} {v}" for v, n in counts.items()))


def results_json(url: str, model: str, results: Sequence[ProbeResult]) -> bytes:
    """``{"url", "model", "failed", "probes": [{probe, verdict, evidence, rule,
    source}]}`` as indented JSON."""
    doc: dict[str, Any] = {
        "url": url,
        "model": model,
        "failed": sum(r.verdict is Verdict.FAIL for r in results),
        "probes": [
            {"probe": r.probe, "verdict": r.verdict.value, "evidence": r.evidence,
             "rule": r.rule, "source": r.source}
            for r in results
        ],
    }  # fmt: skip
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)
